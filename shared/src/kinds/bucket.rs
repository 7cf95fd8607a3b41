//! Token bucket arithmetic: given the stored state, the limits of this call and a clock
//! reading, what is the answer and what must be stored. Pure: no parsing, no output.
//!
//! Levels are f64 tokens; every time is integer epoch milliseconds. Retry and reset times
//! are found against the very predicate that admits a take, so waiting exactly
//! `retry_after_ms` admits and waiting 1 ms less does not, whatever the float rounding.

use crate::units::{MAX_TOKENS, MAX_WAIT_MS, MS_PER_MINUTE};

/// What a bucket row stores: `level` tokens at `refilled_at`; `full_at` is when it is full
/// again under the limits of the call that wrote it (the sweep removes it from then on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    pub level: f64,
    pub refilled_at: i64,
    pub full_at: i64,
}

/// The limits passed with a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketLimits {
    pub burst: f64,
    pub refill_per_minute: f64,
}

impl BucketLimits {
    /// Seconds an empty bucket takes to fill, at most the longest wait ever reported.
    pub fn refill_seconds(&self) -> f64 {
        (self.burst * 60.0 / self.refill_per_minute).min((MAX_WAIT_MS / 1000) as f64)
    }
}

/// A bucket as a kind: tokens, its burst and refill scaled alike.
impl crate::kind::LimitKind for BucketLimits {
    type Row = Option<BucketState>;
    type Answer = TakeDecision;
    type Cost = f64;

    fn scales_by(&self, m: f64) -> bool {
        let rate = |v: f64| v * m > 0.0 && v * m <= MAX_TOKENS;
        rate(self.burst) && rate(self.refill_per_minute)
    }

    fn scaled(&self, m: f64) -> Self {
        BucketLimits { burst: self.burst * m, refill_per_minute: self.refill_per_minute * m }
    }

    fn definition(&self) -> crate::json::Json {
        use crate::json::Json;
        Json::Object(vec![
            ("burst", Json::Number(self.burst)),
            ("refill_per_minute", Json::Number(self.refill_per_minute)),
        ])
    }

    fn take(&self, row: &Option<BucketState>, cost: f64, now_ms: i64) -> TakeDecision {
        take(row.as_ref(), self, cost, now_ms)
    }

    fn admitted(answer: &TakeDecision) -> bool {
        answer.admitted
    }

    fn wait_ms(answer: &TakeDecision, _now_ms: i64) -> i64 {
        answer.retry_after_ms
    }
}

/// The answer to a take, and the state to store when it admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeDecision {
    pub admitted: bool,
    /// Whole tokens left after the call.
    pub remaining: i64,
    pub limit: f64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    /// Refused because `cost` is above the burst: no wait will admit it.
    pub exceeds_limit: bool,
    /// Seconds a whole burst takes to refill (the headers' window, `w`).
    pub refill_seconds: f64,
    /// Some exactly when admitted: the row to write.
    pub new_state: Option<BucketState>,
}

/// Tokens in the bucket at time `t`. No row is a full bucket; a clock behind the row's
/// refill time gets no refill; the level never exceeds the current burst. A level below 0
/// is a debt ([`charge`]) that refill pays back before anything can be taken.
pub fn level_at(state: Option<&BucketState>, limits: &BucketLimits, t: i64) -> f64 {
    match state {
        None => limits.burst,
        Some(s) => {
            let stored = if s.level.is_finite() { s.level } else { 0.0 };
            let elapsed = t.saturating_sub(s.refilled_at).max(0) as f64;
            (stored + elapsed * limits.refill_per_minute / MS_PER_MINUTE).min(limits.burst)
        }
    }
}

/// Milliseconds from `now` until the bucket holds `target` tokens (0 if it already does),
/// capped at [`MAX_WAIT_MS`]. The estimate is corrected against [`level_at`] itself.
pub fn wait_for(state: Option<&BucketState>, limits: &BucketLimits, now: i64, target: f64) -> i64 {
    let ready = |wait: i64| level_at(state, limits, now + wait) >= target;
    if ready(0) {
        return 0;
    }
    let Some(s) = state else {
        // Only a target above the burst is unreachable from a full bucket.
        return MAX_WAIT_MS;
    };
    if target > limits.burst {
        return MAX_WAIT_MS;
    }
    let start = s.refilled_at.max(now);
    let deficit = target - level_at(state, limits, start);
    let estimate = (start - now) as f64 + (deficit * MS_PER_MINUTE / limits.refill_per_minute).ceil();
    if estimate.is_nan() || estimate >= MAX_WAIT_MS as f64 {
        return MAX_WAIT_MS;
    }
    let mut wait = (estimate as i64).max(1);
    // Mostly the estimate is the edge itself: say so without the stepping below.
    if ready(wait) && (wait <= 1 || !ready(wait - 1)) {
        return wait.min(MAX_WAIT_MS);
    }
    // Float rounding can put the estimate a few ms off either way; step to the exact edge.
    for _ in 0..64 {
        if ready(wait) {
            break;
        }
        wait += 1;
    }
    for _ in 0..64 {
        if wait <= 1 || !ready(wait - 1) {
            break;
        }
        wait -= 1;
    }
    wait.min(MAX_WAIT_MS)
}

/// The one question of a bucket: take `cost` tokens now?
pub fn take(state: Option<&BucketState>, limits: &BucketLimits, cost: f64, now: i64) -> TakeDecision {
    let level = level_at(state, limits, now);
    if cost <= level {
        taken(state, limits, level, cost, now)
    } else {
        let retry_after_ms = if cost > limits.burst {
            // Never admitted: report the time to refill a whole bucket.
            let full = (limits.burst * MS_PER_MINUTE / limits.refill_per_minute).ceil();
            if full < MAX_WAIT_MS as f64 {
                (full as i64).max(1)
            } else {
                MAX_WAIT_MS
            }
        } else {
            wait_for(state, limits, now, cost)
        };
        TakeDecision {
            admitted: false,
            remaining: level.floor() as i64,
            limit: limits.burst,
            retry_after_ms,
            reset_after_ms: wait_for(state, limits, now, limits.burst),
            exceeds_limit: cost > limits.burst,
            refill_seconds: limits.refill_seconds(),
            new_state: None,
        }
    }
}

/// Takes `amount` tokens whatever the level: the cost of work already done, which may
/// leave the bucket in debt. Answers like an admitted take; a debt deeper than
/// [`MAX_TOKENS`] is not taken (answered as refused, writing nothing), so levels stay
/// exact and finite.
pub fn charge(state: Option<&BucketState>, limits: &BucketLimits, amount: f64, now: i64) -> TakeDecision {
    let level = level_at(state, limits, now);
    if level - amount < -MAX_TOKENS {
        return TakeDecision {
            admitted: false,
            retry_after_ms: MAX_WAIT_MS,
            new_state: None,
            ..take(state, limits, 0.0, now)
        };
    }
    taken(state, limits, level, amount, now)
}

/// Whether a charge's answer is the refusal of a debt past [`MAX_TOKENS`].
pub fn debt_too_deep(d: &TakeDecision) -> bool {
    !d.admitted
}

/// The admitted answer of `amount` taken from `level` (the bucket's level now).
fn taken(state: Option<&BucketState>, limits: &BucketLimits, level: f64, amount: f64, now: i64) -> TakeDecision {
    let refilled_at = state.map_or(now, |s| s.refilled_at.max(now));
    let mut new_state = BucketState { level: level - amount, refilled_at, full_at: refilled_at };
    let reset_after_ms = wait_for(Some(&new_state), limits, now, limits.burst);
    new_state.full_at = now + reset_after_ms;
    TakeDecision {
        admitted: true,
        remaining: new_state.level.floor() as i64,
        limit: limits.burst,
        retry_after_ms: 0,
        reset_after_ms,
        exceeds_limit: false,
        refill_seconds: limits.refill_seconds(),
        new_state: Some(new_state),
    }
}

/// The row that answers exactly as no row does: full at any burst (it refilled since the
/// epoch), and removable by the sweep at once.
pub fn untouched(limits: &BucketLimits) -> BucketState {
    BucketState { level: limits.burst, refilled_at: 0, full_at: 0 }
}

/// The state after tokens are given back.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundDecision {
    pub remaining: i64,
    pub limit: f64,
    pub reset_after_ms: i64,
    /// Some when the level changed: the row to write.
    pub new_state: Option<BucketState>,
}

/// Gives `amount` tokens back, never above the burst. A full bucket (or none) is unchanged.
pub fn refund(state: Option<&BucketState>, limits: &BucketLimits, amount: f64, now: i64) -> RefundDecision {
    let level = level_at(state, limits, now);
    let new_state = state.filter(|_| level < limits.burst).map(|s| {
        let refilled_at = s.refilled_at.max(now);
        let mut new = BucketState { level: (level + amount).min(limits.burst), refilled_at, full_at: refilled_at };
        new.full_at = now + wait_for(Some(&new), limits, now, limits.burst);
        new
    });
    let after = new_state.as_ref().or(state);
    RefundDecision {
        remaining: level_at(after, limits, now).floor() as i64,
        limit: limits.burst,
        reset_after_ms: wait_for(after, limits, now, limits.burst),
        new_state,
    }
}
