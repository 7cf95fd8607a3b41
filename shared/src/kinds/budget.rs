//! Calendar budgets: a quota per UTC hour, day, ISO week, month or year, counted in exact millionths. Pure: no
//! parsing, no output.

use crate::units::{ceil_seconds, Period};

/// What a budget row stores: `used` millionths in the period ending at `resets_at` (epoch ms),
/// and the `quota` (millionths) of the last spend that wrote it, 0 when no spend did (a
/// charge or refund keeps the row's): what rl_budgets_near measures `used` against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    pub used: i64,
    pub resets_at: i64,
    pub quota: i64,
}

impl BudgetState {
    /// The quota a change that is not a spend keeps: the row's, 0 without one.
    fn kept_quota(state: Option<&BudgetState>) -> i64 {
        state.map_or(0, |s| s.quota)
    }
}

/// A budget's limits: `quota` millionths per `period`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetLimits {
    pub period: Period,
    pub quota: i64,
}

/// A budget as a kind: millionths, its quota scaled, never its period.
impl crate::kind::LimitKind for BudgetLimits {
    type Row = Option<BudgetState>;
    type Answer = SpendDecision;
    type Cost = i64;

    fn scales_by(&self, m: f64) -> bool {
        crate::kind::micros_scale_by(self.quota, m)
    }

    fn scaled(&self, m: f64) -> Self {
        BudgetLimits { period: self.period, quota: crate::kind::scaled_micros(self.quota, m) }
    }

    fn definition(&self) -> crate::json::Json {
        use crate::json::Json;
        Json::Object(vec![("period", Json::Str(self.period.text().into_owned())), ("quota", Json::micros(self.quota))])
    }

    fn take(&self, row: &Option<BudgetState>, cost: i64, now_ms: i64) -> SpendDecision {
        spend(row.as_ref(), self.period, self.quota, cost, now_ms)
    }

    fn admitted(answer: &SpendDecision) -> bool {
        answer.admitted
    }

    /// A refused spend waits for the period to turn.
    fn wait_ms(answer: &SpendDecision, now_ms: i64) -> i64 {
        if answer.admitted {
            0
        } else {
            answer.resets_at_ms - now_ms
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendDecision {
    pub admitted: bool,
    /// The period's total after the call, in millionths.
    pub used: i64,
    pub quota: i64,
    pub resets_at_ms: i64,
    pub retry_after_seconds: i64,
    /// Seconds from the call until the period turns (whole again), rounded up: what
    /// `reset_after_seconds` means for buckets and windows too.
    pub reset_after_seconds: i64,
    /// Refused because `cost` is above the quota: no period will admit it.
    pub exceeds_limit: bool,
    /// The length of the period answered from (a day, or that month), in ms.
    pub period_ms: i64,
    /// The row to write: when admitted, and when a refusal's quota is not the one the
    /// current period's row holds (so rl_budgets_near measures against the quota now asked).
    pub new_state: Option<BudgetState>,
}

/// The one question of a budget: spend `cost` now? A row whose period has ended counts as
/// nothing spent; a caller whose clock is behind a newer stored period is answered from
/// that newer period, so a stored period never moves backwards. A refusal writes only a
/// changed quota into the current period's row (its count stays).
pub fn spend(state: Option<&BudgetState>, period: Period, quota: i64, cost: i64, now: i64) -> SpendDecision {
    // the period's length with as few reads of its zone as can be
    let (used, resets_at, period_ms) = match state {
        Some(s) if s.resets_at > now => (s.used.max(0), s.resets_at, s.resets_at - period.start_ms(s.resets_at - 1)),
        _ => {
            let (start, end) = period.bounds(now);
            (0, end, end - start)
        }
    };
    let total = used.saturating_add(cost);
    let admitted = total <= quota;
    SpendDecision {
        admitted,
        used: if admitted { total } else { used },
        quota,
        resets_at_ms: resets_at,
        retry_after_seconds: if admitted { 0 } else { ceil_seconds(resets_at - now) },
        reset_after_seconds: ceil_seconds(resets_at - now).max(0),
        exceeds_limit: !admitted && cost > quota,
        period_ms,
        new_state: if admitted {
            Some(BudgetState { used: total, resets_at, quota })
        } else {
            state.filter(|s| s.resets_at > now && s.quota != quota).map(|s| BudgetState { quota, ..*s })
        },
    }
}

/// The row that answers exactly as no row does: nothing used in the current period.
pub fn untouched(period: Period, now_ms: i64) -> BudgetState {
    BudgetState { used: 0, resets_at: period.end_ms(now_ms), quota: 0 }
}

/// The state after part of a period's use is given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefund {
    pub used: i64,
    pub resets_at_ms: i64,
    /// Some when `used` changed: the row to write.
    pub new_state: Option<BudgetState>,
}

/// Lowers the current period's `used` by `amount`, never below 0.
pub fn refund(state: Option<&BudgetState>, period: Period, amount: i64, now: i64) -> BudgetRefund {
    let current = state.filter(|s| s.resets_at > now);
    let resets_at = current.map_or_else(|| period.end_ms(now), |s| s.resets_at);
    let used = current.map_or(0, |s| s.used.max(0));
    let new_used = (used - amount).max(0);
    BudgetRefund {
        used: new_used,
        resets_at_ms: resets_at,
        new_state: (new_used != used).then_some(BudgetState {
            used: new_used,
            resets_at,
            quota: BudgetState::kept_quota(state),
        }),
    }
}

/// What a charge after the fact answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCharge {
    pub used: i64,
    pub resets_at_ms: i64,
    /// Not charged: the period's use would pass [`MAX_USED`].
    pub too_much: bool,
    pub new_state: Option<BudgetState>,
}

/// Most millionths a period may count: where they stop being exact in JSON, about 9
/// billion units past any quota.
pub const MAX_USED: i64 = crate::units::MAX_WAIT_MS;

/// Adds `amount` to the current period's use, past its quota if need be: later spends in
/// the period are refused. A total past [`MAX_USED`] is not charged (nothing is written).
pub fn charge(state: Option<&BudgetState>, period: Period, amount: i64, now: i64) -> BudgetCharge {
    let current = state.filter(|s| s.resets_at > now);
    let resets_at = current.map_or_else(|| period.end_ms(now), |s| s.resets_at);
    let before = current.map_or(0, |s| s.used.max(0));
    let total = before.saturating_add(amount);
    if total > MAX_USED {
        return BudgetCharge { used: before, resets_at_ms: resets_at, too_much: true, new_state: None };
    }
    BudgetCharge {
        used: total,
        resets_at_ms: resets_at,
        too_much: false,
        new_state: Some(BudgetState { used: total, resets_at, quota: BudgetState::kept_quota(state) }),
    }
}

/// A charge of a budget whose quota the caller gives (rl_charge_all, rl_charge_check): the
/// charge of [`charge`], answered as a spend that was admitted (`remaining` below 0 past the
/// quota), and the quota kept with the row as a spend keeps it. None past [`MAX_USED`].
pub fn charge_against(
    state: Option<&BudgetState>,
    period: Period,
    quota: i64,
    amount: i64,
    now: i64,
) -> Option<SpendDecision> {
    let c = charge(state, period, amount, now);
    if c.too_much {
        return None;
    }
    Some(SpendDecision {
        admitted: true,
        used: c.used,
        quota,
        resets_at_ms: c.resets_at_ms,
        retry_after_seconds: 0,
        reset_after_seconds: ceil_seconds(c.resets_at_ms - now).max(0),
        exceeds_limit: false,
        period_ms: c.resets_at_ms - period.start_ms(c.resets_at_ms - 1),
        new_state: c.new_state.map(|s| BudgetState { quota, ..s }),
    })
}

/// A budget near its quota, as rl_budgets_near lists it (the row, with its quota as the last
/// spend gave it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NearBudget {
    pub key: String,
    pub period: String,
    pub used: i64,
    pub quota: i64,
    pub resets_at: i64,
}

/// What rl_budgets_near answers: the fraction asked for and the budgets at or past it, the
/// most used (as a share of the quota) first.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetsNear {
    pub fraction: f64,
    pub budgets: Vec<NearBudget>,
}

/// Most budgets one rl_budgets_near call lists.
pub const MAX_NEAR: i64 = 10_000;
/// The largest fraction rl_budgets_near takes: a million times the quota, far past what a
/// charge may add.
pub const MAX_NEAR_FRACTION: f64 = 1_000_000.0;

/// One ended period of a budget as kept for invoicing (rl_usage): its final `used` and the
/// `quota` of its last spend, in millionths, and its bounds (epoch ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsagePeriod {
    pub key: String,
    pub period: String,
    pub starts_at: i64,
    pub ends_at: i64,
    pub used: i64,
    pub quota: i64,
}

impl UsagePeriod {
    /// The period `row` of budget `key` counted, as kept once it has ended.
    pub fn of(key: &str, period: Period, row: &BudgetState) -> UsagePeriod {
        UsagePeriod {
            key: key.to_owned(),
            period: period.text().into_owned(),
            starts_at: period.start_ms(row.resets_at - 1),
            ends_at: row.resets_at,
            used: row.used,
            quota: row.quota,
        }
    }
}

/// Whether writing `new` over `old` ends `old`'s period with something counted in it: the
/// write starts a later period (every budget write does once the stored one has ended), so
/// `old` is kept for invoicing first. A row nothing was counted in (one a refused
/// rl_take_all inserted to lock, or refunded to 0) is not kept.
pub fn ends_counted_period(old: &BudgetState, new: &BudgetState) -> bool {
    new.resets_at > old.resets_at && old.used != 0
}

/// How long ended periods are kept unless rl_usage_retention says otherwise (400 days, more
/// than 13 months): rl_sweep removes those that ended longer ago.
pub const USAGE_KEPT_MS: i64 = 400 * crate::units::MS_PER_DAY;
/// The setting (rl_setting) rl_usage_retention writes: how long ended periods are kept, in ms.
pub const USAGE_RETENTION_SETTING: &str = "usage_retention_ms";
/// The longest retention rl_usage_retention takes, in days (a hundred years).
pub const MAX_RETENTION_DAYS: i64 = 36_500;
/// Most ended periods one rl_usage call answers.
pub const MAX_USAGE_PERIODS: i64 = 10_000;

/// The periods one rl_usage_all page lists unless told otherwise.
pub const USAGE_PAGE: i64 = 1_000;

/// Where a page of every key's ended periods stopped: the last period listed, by its end,
/// key and period (rl_usage_all's order); the next page starts after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageCursor {
    pub ends_at: i64,
    pub key: String,
    pub period: String,
}

impl UsageCursor {
    /// The place of `period` in rl_usage_all's order.
    pub fn at(period: &UsagePeriod) -> UsageCursor {
        UsageCursor { ends_at: period.ends_at, key: period.key.clone(), period: period.period.clone() }
    }
}

/// One page of every key's ended periods, as rl_usage_all answers: those that ended after
/// `from_ms` and by `to_ms`, by end, then key, then period (in byte order), after the
/// cursor it was given; `next` is the last one's place when more follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsagePage {
    pub from_ms: i64,
    pub to_ms: i64,
    pub periods: Vec<UsagePeriod>,
    pub next: Option<UsageCursor>,
}

/// Ended periods of one key, as rl_usage answers: those that ended after `from_ms` and by
/// `to_ms`, by end then period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub key: String,
    pub from_ms: i64,
    pub to_ms: i64,
    pub periods: Vec<UsagePeriod>,
}

/// Whether a budget row is listed by rl_budgets_near(fraction) at `now`: its period is
/// current, a spend gave it a quota, and it used at least `fraction` of it. The share is
/// `used / quota` in doubles, as the statement computes it: a division rounds once, so a
/// share that is exactly a decimal fraction (20 of 100) equals that fraction as given (0.2),
/// where `fraction * quota` would round past it. The list is in [`near_order`].
pub fn is_near(row: &BudgetState, fraction: f64, now: i64) -> bool {
    row.resets_at > now && row.quota > 0 && row.used as f64 / row.quota as f64 >= fraction
}

/// The order of rl_budgets_near's list: the largest share of the quota first, then key
/// and period.
pub fn near_order(a: &NearBudget, b: &NearBudget) -> std::cmp::Ordering {
    let share = |n: &NearBudget| n.used as f64 / n.quota as f64;
    share(b).total_cmp(&share(a)).then_with(|| a.key.cmp(&b.key)).then_with(|| a.period.cmp(&b.period))
}
