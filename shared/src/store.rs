//! The seam between the rules and an engine: the few statements an engine runs, and the
//! protocol that makes one call one atomic read-modify-write on top of them.
//!
//! Protocol: read the row, decide, and write only when admitting, with a write that only
//! succeeds if the row is still what was read (compare-and-set). A refusal is answered
//! from the row it read and writes nothing. When the row changed in between, read again;
//! from the second attempt on the read asks the engine to lock the row (PostgreSQL: FOR
//! UPDATE), so contention costs a bounded number of attempts.

use crate::bucket::{self, BucketState, TakeArgs, TakeDecision};
use crate::budget::{self, BudgetState, Period, SpendArgs, SpendDecision};
use crate::error::{Error, Result};

/// Attempts before a call gives up on a row that keeps changing under it. With row locks
/// the second attempt succeeds; engines without them (SQLite) retry only while another
/// connection commits between a read and a write, which its write lock makes rare.
pub const MAX_ATTEMPTS: u32 = 1000;

/// A statement that failed in the engine: its message, and the engine's own error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub message: String,
    pub engine_code: Option<i32>,
}

pub type StoreResult<T> = std::result::Result<T, StoreError>;

impl StoreError {
    fn in_call(self, function: &'static str) -> Error {
        let mut e = Error::storage(function, self.message);
        e.engine_code = self.engine_code;
        e
    }
}

/// The statements an engine provides. `lock` asks to hold the row until the transaction
/// ends, where the engine has row locks. Writes return whether they happened.
pub trait StateStore {
    /// Whether the database or transaction refuses writes.
    fn read_only(&mut self) -> StoreResult<bool>;
    fn read_bucket(&mut self, key: &str, lock: bool) -> StoreResult<Option<BucketState>>;
    /// Insert `new` if `expected` is None and no row exists, else update the row if it
    /// still holds `expected`.
    fn write_bucket(&mut self, key: &str, expected: Option<&BucketState>, new: &BucketState) -> StoreResult<bool>;
    fn read_budget(&mut self, key: &str, period: Period, lock: bool) -> StoreResult<Option<BudgetState>>;
    fn write_budget(&mut self, key: &str, period: Period, expected: Option<&BudgetState>, new: &BudgetState) -> StoreResult<bool>;
    /// Delete at most `limit` buckets that are full by `cutoff_ms`. The delete re-checks
    /// `full_at` on the row it deletes, so a row a concurrent take just refilled stays.
    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// Delete at most `limit` budgets whose period ended by `cutoff_ms`.
    fn sweep_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
}

fn writable<S: StateStore>(store: &mut S, function: &'static str) -> Result<()> {
    if store.read_only().map_err(|e| e.in_call(function))? {
        return Err(Error::read_only(function));
    }
    Ok(())
}

fn gave_up(function: &'static str) -> Error {
    Error::storage(function, format!("the row kept changing under {MAX_ATTEMPTS} attempts; try again"))
}

/// rl_take: one atomic take.
pub fn take<S: StateStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<TakeDecision> {
    writable(store, function)?;
    for attempt in 0..MAX_ATTEMPTS {
        let state = store.read_bucket(a.key, attempt > 0).map_err(|e| e.in_call(function))?;
        let decision = bucket::take(state.as_ref(), &a.limits, a.cost, a.now_ms);
        match &decision.new_state {
            None => return Ok(decision),
            Some(new) if store.write_bucket(a.key, state.as_ref(), new).map_err(|e| e.in_call(function))? => {
                return Ok(decision)
            }
            Some(_) => continue,
        }
    }
    Err(gave_up(function))
}

/// rl_spend: one atomic spend.
pub fn spend<S: StateStore>(store: &mut S, function: &'static str, a: &SpendArgs) -> Result<SpendDecision> {
    writable(store, function)?;
    for attempt in 0..MAX_ATTEMPTS {
        let state = store.read_budget(a.key, a.period, attempt > 0).map_err(|e| e.in_call(function))?;
        let decision = budget::spend(state.as_ref(), a.period, a.quota, a.cost, a.now_ms);
        match &decision.new_state {
            None => return Ok(decision),
            Some(new) if store.write_budget(a.key, a.period, state.as_ref(), new).map_err(|e| e.in_call(function))? => {
                return Ok(decision)
            }
            Some(_) => continue,
        }
    }
    Err(gave_up(function))
}

/// rl_budget: what rl_spend would answer, spending nothing.
pub fn peek_budget<S: StateStore>(store: &mut S, function: &'static str, a: &SpendArgs) -> Result<SpendDecision> {
    writable(store, function)?;
    let state = store.read_budget(a.key, a.period, false).map_err(|e| e.in_call(function))?;
    Ok(budget::spend(state.as_ref(), a.period, a.quota, a.cost, a.now_ms))
}

/// rl_sweep: remove at most `max_rows` rows that no longer change any answer, buckets first.
pub fn sweep<S: StateStore>(store: &mut S, function: &'static str, cutoff_ms: i64, max_rows: i64) -> Result<i64> {
    writable(store, function)?;
    let buckets = store.sweep_buckets(cutoff_ms, max_rows).map_err(|e| e.in_call(function))?;
    if buckets >= max_rows {
        return Ok(buckets);
    }
    let budgets = store.sweep_budgets(cutoff_ms, max_rows - buckets).map_err(|e| e.in_call(function))?;
    Ok(buckets + budgets)
}
