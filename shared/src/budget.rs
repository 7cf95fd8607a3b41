//! Calendar budgets: a quota per UTC day or month, counted in exact millionths. Pure: no
//! parsing, no output.

use crate::units::{ceil_seconds, Period};

/// What a budget row stores: `used` millionths in the period ending at `resets_at` (epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    pub used: i64,
    pub resets_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendDecision {
    pub admitted: bool,
    /// The period's total after the call, in millionths.
    pub used: i64,
    pub quota: i64,
    pub resets_at_ms: i64,
    pub retry_after_seconds: i64,
    /// Refused because `cost` is above the quota: no period will admit it.
    pub exceeds_limit: bool,
    /// The length of the period answered from (a day, or that month), in ms.
    pub period_ms: i64,
    /// Some exactly when admitted: the row to write.
    pub new_state: Option<BudgetState>,
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
        exceeds_limit: !admitted && cost > quota,
        period_ms: resets_at - period.start_ms(resets_at - 1),
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
        new_state: Some(BudgetState { used: total, resets_at }),
    }
}
