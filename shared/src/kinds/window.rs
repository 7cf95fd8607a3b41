//! Exact sliding windows: at most `limit` units admitted in any `window_ms`; and fixed
//! windows: at most `limit` units in each window `[k * window_ms, (k + 1) * window_ms)` of
//! epoch time, the count starting again at each window's start. Pure: the stored admissions
//! in, the answer and the admissions to store out.
//!
//! A window keeps every admission that still counts, one entry per millisecond (two in the
//! same millisecond merge). An entry made at `at` counts while `at > now - window_ms`, and
//! stops counting at `at + window_ms` exactly, so every wait is an exact integer.
//!
//! A fixed window is the same arithmetic with one change: an admission is recorded at the
//! start of the window it falls in, not at its own millisecond. Its entries then merge into
//! one per window, that entry counts exactly until the window ends, and every wait is the
//! time to the window's end.

use crate::units::MICROS_PER_UNIT;

/// Most entries one window keeps. A call that would store one more is refused with an
/// error rather than answered approximately. An entry takes at most 29 bytes of text
/// (a delta of at most a year in ms, and millionths), so a window holds at most ~290 KB.
pub const MAX_ENTRIES: usize = 10_000;

/// Units admitted (millionths) in one millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub at: i64,
    pub micros: i64,
}

/// The limits passed with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// Millionths.
    pub limit: i64,
    pub window_ms: i64,
    /// A fixed window (aligned to the epoch) rather than a sliding one.
    pub fixed: bool,
}

impl WindowLimits {
    /// When an admission made at `now` is recorded: `now` in a sliding window, the start
    /// of the window holding `now` in a fixed one.
    pub fn recorded_at(&self, now: i64) -> i64 {
        if self.fixed {
            now - now.rem_euclid(self.window_ms)
        } else {
            now
        }
    }
}

/// A window as a kind, sliding or fixed: millionths, its limit scaled, never its length.
impl crate::kind::LimitKind for WindowLimits {
    type Row = Vec<Entry>;
    type Answer = WindowDecision;
    type Cost = i64;

    fn scales_by(&self, m: f64) -> bool {
        crate::kind::micros_scale_by(self.limit, m)
    }

    fn scaled(&self, m: f64) -> Self {
        WindowLimits { limit: crate::kind::scaled_micros(self.limit, m), ..*self }
    }

    fn definition(&self) -> crate::json::Json {
        use crate::json::Json;
        let length = if self.fixed { "fixed_window_seconds" } else { "window_seconds" };
        Json::Object(vec![("limit", Json::micros(self.limit)), (length, Json::Number(self.window_ms as f64 / 1000.0))])
    }

    fn take(&self, row: &Vec<Entry>, cost: i64, now_ms: i64) -> WindowDecision {
        take(row, self, cost, now_ms)
    }

    fn admitted(answer: &WindowDecision) -> bool {
        answer.admitted
    }

    fn wait_ms(answer: &WindowDecision, _now_ms: i64) -> i64 {
        answer.retry_after_ms
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowDecision {
    pub admitted: bool,
    /// Whole units left in the window after the call (never below 0).
    pub remaining: i64,
    /// Millionths.
    pub limit: i64,
    pub retry_after_ms: i64,
    /// Until every entry counted after the call has left the window.
    pub reset_after_ms: i64,
    pub window_ms: i64,
    /// Refused because `cost` is above the limit: no wait will admit it.
    pub exceeds_limit: bool,
    /// Some exactly when admitted: the entries to store (those still counting, sorted).
    pub new_entries: Option<Vec<Entry>>,
}

/// The entries that count at `now`: a suffix of the sorted list. Entries ahead of `now`
/// (a caller whose clock is behind) count too, so skewed clocks cannot admit extra units.
fn counting<'e>(entries: &'e [Entry], limits: &WindowLimits, now: i64) -> &'e [Entry] {
    let first = entries.partition_point(|e| e.at.saturating_add(limits.window_ms) <= now);
    &entries[first..]
}

/// The one question of a window: admit `cost` millionths now?
pub fn take(entries: &[Entry], limits: &WindowLimits, cost: i64, now: i64) -> WindowDecision {
    let counted = counting(entries, limits, now);
    let used: i64 = counted.iter().map(|e| e.micros).sum();
    let admitted = used.saturating_add(cost) <= limits.limit;
    // A cost of 0 (a peek at what is left) records no entry.
    let after = if admitted && cost > 0 {
        with_entry(counted, Entry { at: limits.recorded_at(now), micros: cost })
    } else {
        counted.to_vec()
    };
    let used_after = if admitted { used + cost } else { used };
    let reset_after_ms = after.iter().map(|e| e.at + limits.window_ms - now).max().unwrap_or(0).max(0);
    let retry_after_ms = if admitted {
        0
    } else if cost > limits.limit {
        // Never admitted: the time until the window is empty.
        reset_after_ms.max(1)
    } else {
        // Entries leave oldest first; wait for the one whose leaving frees enough.
        let need = used + cost - limits.limit;
        let mut freed = 0;
        counted
            .iter()
            .find(|e| {
                freed += e.micros;
                freed >= need
            })
            .map_or(1, |e| e.at + limits.window_ms - now)
    };
    WindowDecision {
        admitted,
        remaining: ((limits.limit - used_after) / MICROS_PER_UNIT).max(0),
        limit: limits.limit,
        retry_after_ms,
        reset_after_ms,
        window_ms: limits.window_ms,
        exceeds_limit: !admitted && cost > limits.limit,
        new_entries: admitted.then_some(after),
    }
}

/// Records `cost` millionths now whatever the window holds: the cost of work already done.
/// The window may then count more than its limit; `remaining` says how far past it (below 0)
/// and later takes wait until enough entries leave. Answered as an admitted take.
pub fn charge(entries: &[Entry], limits: &WindowLimits, cost: i64, now: i64) -> WindowDecision {
    let after = with_entry(counting(entries, limits, now), Entry { at: limits.recorded_at(now), micros: cost });
    let used_after: i64 = after.iter().map(|e| e.micros).sum();
    let reset_after_ms = after.iter().map(|e| e.at + limits.window_ms - now).max().unwrap_or(0).max(0);
    WindowDecision {
        admitted: true,
        remaining: (limits.limit - used_after).div_euclid(MICROS_PER_UNIT),
        limit: limits.limit,
        retry_after_ms: 0,
        reset_after_ms,
        window_ms: limits.window_ms,
        exceeds_limit: false,
        new_entries: Some(after),
    }
}

/// `entries` less `micros` taken from the newest first: what giving back the last
/// admission (or several) leaves.
pub fn refund(entries: &[Entry], micros: i64) -> Vec<Entry> {
    let mut out = entries.to_vec();
    let mut left = micros;
    while left > 0 {
        let Some(last) = out.last_mut() else { break };
        let taken = left.min(last.micros);
        last.micros -= taken;
        left -= taken;
        if last.micros == 0 {
            out.pop();
        }
    }
    out
}

/// `entries` with `entry` added in time order, merged into an entry of the same millisecond.
fn with_entry(entries: &[Entry], entry: Entry) -> Vec<Entry> {
    let mut out = entries.to_vec();
    match out.binary_search_by_key(&entry.at, |e| e.at) {
        Ok(i) => out[i].micros += entry.micros,
        Err(i) => out.insert(i, entry),
    }
    out
}

/// When the last entry leaves the window (the sweep removes the row from then on).
pub fn empty_at(entries: &[Entry], window_ms: i64) -> i64 {
    entries.last().map_or(0, |e| e.at + window_ms)
}

/// The stored text: entries in time order separated by `,`, each `delta` or
/// `delta:millionths` (one whole unit is left out), the first delta from the epoch.
pub fn encode(entries: &[Entry]) -> String {
    let mut out = String::with_capacity(entries.len() * 8);
    let mut previous = 0;
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&(e.at - previous).to_string());
        if e.micros != MICROS_PER_UNIT {
            out.push(':');
            out.push_str(&e.micros.to_string());
        }
        previous = e.at;
    }
    out
}

/// The entries of a stored text; None if it is not one [`encode`] writes.
pub fn decode(text: &str) -> Option<Vec<Entry>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    let mut at: i64 = 0;
    text.split(',')
        .enumerate()
        .map(|(i, item)| {
            let (delta, micros) = match item.split_once(':') {
                Some((d, m)) => (d.parse::<i64>().ok()?, m.parse::<i64>().ok()?),
                None => (item.parse::<i64>().ok()?, MICROS_PER_UNIT),
            };
            at = at.checked_add(delta)?;
            // Times strictly ascend after the first.
            (micros > 0 && (delta > 0 || (i == 0 && delta == 0))).then_some(Entry { at, micros })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: i64 = MICROS_PER_UNIT;
    const LIMITS: WindowLimits = WindowLimits { limit: 3 * U, window_ms: 10_000, fixed: false };
    const FIXED: WindowLimits = WindowLimits { fixed: true, ..LIMITS };

    fn run(entries: &mut Vec<Entry>, cost: i64, now: i64) -> WindowDecision {
        let d = take(entries, &LIMITS, cost, now);
        if let Some(new) = &d.new_entries {
            *entries = new.clone();
        }
        d
    }

    /// (now, cost, admitted, remaining, retry_after_ms, reset_after_ms)
    #[test]
    fn table() {
        let mut e = Vec::new();
        for (now, cost, admitted, remaining, retry, reset) in [
            (0, U, true, 2, 0, 10_000),
            (0, U, true, 1, 0, 10_000), // merged into the entry at 0
            (5_000, U, true, 0, 0, 10_000),
            (5_001, U, false, 0, 4_999, 9_999),
            (9_999, U, false, 0, 1, 5_001),
            (10_000, U, true, 1, 0, 10_000), // the two units of 0 left at exactly 10 s
            (10_000, 4 * U, false, 1, 10_000, 10_000),
        ] {
            let d = run(&mut e, cost, now);
            assert_eq!(
                (d.admitted, d.remaining, d.retry_after_ms, d.reset_after_ms),
                (admitted, remaining, retry, reset),
                "at {now}"
            );
        }
        assert_eq!(e, vec![Entry { at: 5_000, micros: U }, Entry { at: 10_000, micros: U }]);
    }

    /// A refund takes from the newest entries first, across entries, never below none.
    #[test]
    fn refund_forgets_the_newest_admissions() {
        let e = vec![Entry { at: 0, micros: 2 * U }, Entry { at: 5, micros: U }, Entry { at: 9, micros: U / 2 }];
        assert_eq!(refund(&e, U / 2), e[..2].to_vec());
        assert_eq!(refund(&e, U), vec![e[0], Entry { at: 5, micros: U / 2 }]);
        assert_eq!(refund(&e, 2 * U), vec![Entry { at: 0, micros: 3 * U / 2 }]);
        assert_eq!(refund(&e, 10 * U), vec![]);
        assert_eq!(refund(&e, 0), e);
    }

    #[test]
    fn waiting_the_retry_admits_and_one_ms_less_does_not() {
        let e = vec![Entry { at: 100, micros: 2 * U }, Entry { at: 300, micros: U }];
        for cost in [U, 2 * U, 3 * U] {
            let d = take(&e, &LIMITS, cost, 400);
            assert!(!d.admitted);
            assert!(take(&e, &LIMITS, cost, 400 + d.retry_after_ms).admitted, "{cost}");
            assert!(!take(&e, &LIMITS, cost, 400 + d.retry_after_ms - 1).admitted, "{cost}");
        }
    }

    /// A fixed window of 3 per 10 s: (now, cost, admitted, remaining, retry_after_ms,
    /// reset_after_ms), the count starting again at 10 s and 20 s whatever came just before.
    #[test]
    fn fixed_table() {
        let mut e = Vec::new();
        for (now, cost, admitted, remaining, retry, reset) in [
            (0, U, true, 2, 0, 10_000),
            (4_000, U, true, 1, 0, 6_000),
            (9_999, U, true, 0, 0, 1),
            (9_999, U, false, 0, 1, 1),
            (10_000, U, true, 2, 0, 10_000), // a new window: the three of the first no longer count
            (10_001, 2 * U, true, 0, 0, 9_999),
            (15_000, U, false, 0, 5_000, 5_000),
            (19_999, 4 * U, false, 0, 1, 1), // above the limit: the window's end is all it can say
            (20_000, 3 * U, true, 0, 0, 10_000),
        ] {
            let d = take(&e, &FIXED, cost, now);
            if let Some(new) = &d.new_entries {
                e = new.clone();
            }
            assert_eq!(
                (d.admitted, d.remaining, d.retry_after_ms, d.reset_after_ms),
                (admitted, remaining, retry, reset),
                "at {now}"
            );
        }
        // one entry per window, at its start
        assert_eq!(e, vec![Entry { at: 20_000, micros: 3 * U }]);
        assert_eq!(empty_at(&e, FIXED.window_ms), 30_000);
    }

    #[test]
    fn fixed_windows_record_at_their_start_and_charge_and_refund_there() {
        assert_eq!(FIXED.recorded_at(0), 0);
        assert_eq!(FIXED.recorded_at(19_999), 10_000);
        assert_eq!(LIMITS.recorded_at(19_999), 19_999);
        let d = charge(&[Entry { at: 10_000, micros: 2 * U }], &FIXED, 5 * U, 12_345);
        assert_eq!(d.new_entries, Some(vec![Entry { at: 10_000, micros: 7 * U }]));
        assert_eq!((d.remaining, d.reset_after_ms), (-4, 7_655));
        assert_eq!(refund(&d.new_entries.unwrap(), U), vec![Entry { at: 10_000, micros: 6 * U }]);
        // waiting the retry admits and 1 ms less does not
        let e = vec![Entry { at: 10_000, micros: 3 * U }];
        let d = take(&e, &FIXED, U, 12_000);
        assert!(!d.admitted && take(&e, &FIXED, U, 12_000 + d.retry_after_ms).admitted);
        assert!(!take(&e, &FIXED, U, 12_000 + d.retry_after_ms - 1).admitted);
    }

    #[test]
    fn text_round_trips_and_damage_is_refused() {
        let e = vec![Entry { at: 1_700_000_000_000, micros: U }, Entry { at: 1_700_000_000_007, micros: 1 }];
        assert_eq!(encode(&e), "1700000000000,7:1");
        assert_eq!(decode(&encode(&e)), Some(e));
        assert_eq!(decode(""), Some(vec![]));
        for bad in ["x", "1,0", "0,0", "1,-1", "1:0", "5,,6", "1:2:3"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
