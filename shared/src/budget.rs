//! Calendar budgets: a quota per UTC day or month, counted in exact millionths.

use crate::args::{self, Arg, Clock};
use crate::bucket::ceil_seconds;
use crate::error::Result;
use crate::json::JsonObject;
use chrono::{DateTime, Datelike, NaiveDate};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// The name stored in the period column and accepted from callers.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The end (exclusive) of the UTC calendar period containing `now_ms`, in epoch ms.
    pub fn end_ms(self, now_ms: i64) -> i64 {
        const DAY_MS: i64 = 86_400_000;
        let day_start = now_ms.div_euclid(DAY_MS) * DAY_MS;
        match self {
            Period::Day => day_start + DAY_MS,
            Period::Month => {
                let date = DateTime::from_timestamp_millis(now_ms)
                    .expect("now_ms is validated to lie within calendar range")
                    .date_naive();
                let (year, month) =
                    if date.month() == 12 { (date.year() + 1, 1) } else { (date.year(), date.month() + 1) };
                NaiveDate::from_ymd_opt(year, month, 1)
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .expect("the first of a month always exists")
                    .and_utc()
                    .timestamp_millis()
            }
        }
    }
}

/// What a budget row stores: `used` millionths in the period ending at `resets_at` (epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    pub used: i64,
    pub resets_at: i64,
}

/// The validated arguments of rl_spend / rl_budget.
#[derive(Debug, Clone, PartialEq)]
pub struct SpendArgs<'a> {
    pub key: &'a str,
    pub period: Period,
    pub quota: i64,
    pub cost: i64,
    pub now_ms: i64,
}

impl<'a> SpendArgs<'a> {
    /// `(key, period, quota [, cost = 1 [, now_ms]])`
    pub fn parse(function: &'static str, args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        args::arity(function, args.len(), 3, 5)?;
        Ok(SpendArgs {
            key: args::key(function, &args[0])?,
            period: args::period(function, &args[1])?,
            quota: args::amount_micros(function, "quota", &args[2])?,
            cost: match args.get(3) {
                None => args::MICROS_PER_UNIT,
                Some(a) => args::amount_micros(function, "cost", a)?,
            },
            now_ms: args::now_ms(function, args.get(4), clock)?,
        })
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
    /// Some exactly when admitted: the row to write.
    pub new_state: Option<BudgetState>,
}

impl SpendDecision {
    pub fn to_json(&self) -> String {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .micros("used", self.used)
            .micros("limit", self.quota)
            .micros("remaining", self.quota - self.used)
            .int("resets_at", self.resets_at_ms / 1000)
            .int("retry_after_seconds", self.retry_after_seconds)
            .finish()
    }
}

/// The one question of a budget: spend `cost` now? A row whose period has ended counts as
/// nothing spent; a caller whose clock is behind a newer stored period is answered from
/// that newer period, so a stored period never moves backwards.
pub fn spend(state: Option<&BudgetState>, period: Period, quota: i64, cost: i64, now: i64) -> SpendDecision {
    let (used, resets_at) = match state {
        Some(s) if s.resets_at > now => (s.used.max(0), s.resets_at),
        _ => (0, period.end_ms(now)),
    };
    let total = used.saturating_add(cost);
    let admitted = total <= quota;
    SpendDecision {
        admitted,
        used: if admitted { total } else { used },
        quota,
        resets_at_ms: resets_at,
        retry_after_seconds: if admitted { 0 } else { ceil_seconds(resets_at - now) },
        new_state: admitted.then_some(BudgetState { used: total, resets_at }),
    }
}

/// The row that answers exactly as no row does: nothing used in the current period.
pub fn untouched(period: Period, now_ms: i64) -> BudgetState {
    BudgetState { used: 0, resets_at: period.end_ms(now_ms) }
}

/// The state after part of a period's use is given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefund {
    pub used: i64,
    pub resets_at_ms: i64,
    /// Some when `used` changed: the row to write.
    pub new_state: Option<BudgetState>,
}

impl BudgetRefund {
    pub fn to_json(&self) -> String {
        JsonObject::new().micros("used", self.used).int("resets_at", self.resets_at_ms / 1000).finish()
    }
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
        new_state: (new_used != used).then_some(BudgetState { used: new_used, resets_at }),
    }
}
