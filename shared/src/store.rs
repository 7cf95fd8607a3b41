//! The seam between the rules and an engine: the few statements an engine runs, and the
//! protocol that makes one call one atomic read-modify-write on top of them.
//!
//! A single-row call is one guarded UPDATE (see [`crate::guard`]): the engine hands the
//! row it is about to change to the core's decision and writes what that decision wants,
//! in the same statement. A refusal writes nothing. Only a missing row takes a second
//! statement: an insert that loses to a concurrent insert starts the call again.
//!
//! rl_take_all reads every row, decides, and writes each row only if it is still what was
//! read (compare-and-set), holding row locks (PostgreSQL: FOR UPDATE) or the database's
//! write lock (SQLite: BEGIN IMMEDIATE) meanwhile.

use crate::bucket::{self, BucketState, RefundDecision, TakeArgs, TakeDecision};
use crate::budget::{self, BudgetRefund, BudgetState, Period, SpendArgs, SpendDecision};
use crate::error::{Error, Result};
use crate::guard::Change;
use crate::multi::{self, Item, ItemState, NewRow, TakeAllArgs, TakeAllDecision};

/// Attempts before a call gives up on a row that keeps appearing and disappearing under it
/// (a first insert racing another, a sweep deleting the row between decision and write).
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
    fn write_budget(
        &mut self,
        key: &str,
        period: Period,
        expected: Option<&BudgetState>,
        new: &BudgetState,
    ) -> StoreResult<bool>;
    /// One guarded UPDATE of the bucket row of `key`: the engine calls `change` with the
    /// row as it stands when the statement reaches it (again, if a concurrent write makes
    /// it re-check a newer version), and stores what the last call returned, if anything.
    /// `change` is never called when there is no row. Returns the number of rows written.
    fn change_bucket(&mut self, key: &str, change: &mut Change<'_, BucketState>) -> StoreResult<u64>;
    /// [`StateStore::change_bucket`] for the budget row of `key` and `period`.
    fn change_budget(&mut self, key: &str, period: Period, change: &mut Change<'_, BudgetState>) -> StoreResult<u64>;
    /// Delete at most `limit` buckets that are full by `cutoff_ms`. The delete re-checks
    /// `full_at` on the row it deletes, so a row a concurrent take just refilled stays.
    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// Delete at most `limit` budgets whose period ended by `cutoff_ms`.
    fn sweep_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// Delete every bucket and budget row of `key`.
    fn reset(&mut self, key: &str) -> StoreResult<i64>;
    /// Whether `lock` reads hold row locks (PostgreSQL) rather than relying on a
    /// database-wide write lock (SQLite).
    fn has_row_locks(&self) -> bool;
    /// Makes the following statements one unit that holds the write lock from its start,
    /// unless the caller's own transaction already is one. Returns whether it began one.
    fn begin_atomic(&mut self) -> StoreResult<bool>;
    /// Ends what `begin_atomic` began (`owned`): commit, or roll back after an error.
    fn end_atomic(&mut self, owned: bool, commit: bool) -> StoreResult<()>;
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

/// The one path every single-row change takes: a guarded UPDATE that decides on the row
/// the engine is about to change; without a row, decide on none and insert.
fn change_row<S: StateStore, T: Copy, R>(
    store: &mut S,
    function: &'static str,
    mut change: impl FnMut(&mut S, &mut Change<'_, T>) -> StoreResult<u64>,
    mut insert: impl FnMut(&mut S, &T) -> StoreResult<bool>,
    decide: impl Fn(Option<&T>) -> (R, Option<T>),
) -> Result<R> {
    writable(store, function)?;
    let in_call = |e: StoreError| e.in_call(function);
    for _ in 0..MAX_ATTEMPTS {
        let mut seen: Option<(R, bool)> = None;
        let written = change(store, &mut |row: &T| {
            let (answer, new_row) = decide(Some(row));
            seen = Some((answer, new_row.is_some()));
            new_row
        })
        .map_err(in_call)?;
        match seen {
            Some((answer, wanted_write)) if wanted_write == (written == 1) => return Ok(answer),
            // Decided to write, but the row went away before the write (a sweep): again.
            Some(_) => continue,
            None => {
                let (answer, new_row) = decide(None);
                match new_row {
                    None => return Ok(answer),
                    Some(new) if insert(store, &new).map_err(in_call)? => return Ok(answer),
                    // Another call inserted the row first: decide on that row.
                    Some(_) => continue,
                }
            }
        }
    }
    Err(gave_up(function))
}

/// Runs `work` as one unit: on SQLite outside a transaction, BEGIN IMMEDIATE ... COMMIT,
/// so the read and the write share one transaction under the write lock (and a failure
/// rolls back); elsewhere the caller's transaction already is the unit.
fn atomically<S: StateStore, R>(
    store: &mut S,
    function: &'static str,
    work: impl FnOnce(&mut S) -> Result<R>,
) -> Result<R> {
    let owned = store.begin_atomic().map_err(|e| e.in_call(function))?;
    let outcome = work(store);
    let finished = store.end_atomic(owned, outcome.is_ok()).map_err(|e| e.in_call(function));
    let answer = outcome?;
    finished?;
    Ok(answer)
}

/// [`change_row`] on the bucket row of `key`.
fn change_bucket<S: StateStore, R>(
    store: &mut S,
    function: &'static str,
    key: &str,
    decide: impl Fn(Option<&BucketState>) -> (R, Option<BucketState>),
) -> Result<R> {
    change_row(
        store,
        function,
        |s, change| s.change_bucket(key, change),
        |s, new| s.write_bucket(key, None, new),
        decide,
    )
}

/// [`change_row`] on the budget row of `key` and `period`.
fn change_budget<S: StateStore, R>(
    store: &mut S,
    function: &'static str,
    key: &str,
    period: Period,
    decide: impl Fn(Option<&BudgetState>) -> (R, Option<BudgetState>),
) -> Result<R> {
    change_row(
        store,
        function,
        |s, change| s.change_budget(key, period, change),
        |s, new| s.write_budget(key, period, None, new),
        decide,
    )
}

/// rl_take: one atomic take.
pub fn take<S: StateStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<TakeDecision> {
    change_bucket(store, function, a.key, |state| {
        let d = bucket::take(state, &a.limits, a.cost, a.now_ms);
        (d.clone(), d.new_state)
    })
}

/// rl_refund: give tokens back, never above the burst.
pub fn refund<S: StateStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<RefundDecision> {
    change_bucket(store, function, a.key, |state| {
        let d = bucket::refund(state, &a.limits, a.cost, a.now_ms);
        (d.clone(), d.new_state)
    })
}

/// rl_spend: one atomic spend.
pub fn spend<S: StateStore>(store: &mut S, function: &'static str, a: &SpendArgs) -> Result<SpendDecision> {
    change_budget(store, function, a.key, a.period, |state| {
        let d = budget::spend(state, a.period, a.quota, a.cost, a.now_ms);
        (d.clone(), d.new_state)
    })
}

/// rl_refund_budget: lower what a period used, never below 0.
pub fn refund_budget<S: StateStore>(store: &mut S, function: &'static str, a: &SpendArgs) -> Result<BudgetRefund> {
    change_budget(store, function, a.key, a.period, |state| {
        let d = budget::refund(state, a.period, a.cost, a.now_ms);
        (d.clone(), d.new_state)
    })
}

/// rl_peek: what rl_take would answer, changing nothing.
pub fn peek<S: StateStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<TakeDecision> {
    writable(store, function)?;
    let state = store.read_bucket(a.key, false).map_err(|e| e.in_call(function))?;
    Ok(bucket::take(state.as_ref(), &a.limits, a.cost, a.now_ms))
}

/// rl_reset: forget every bucket and budget under a key.
pub fn reset<S: StateStore>(store: &mut S, function: &'static str, key: &str) -> Result<i64> {
    writable(store, function)?;
    atomically(store, function, |store| store.reset(key).map_err(|e| e.in_call(function)))
}

/// rl_take_all: every item is charged, or none. An unlocked read answers most refusals
/// without writing; otherwise every row is locked in a fixed order (so concurrent calls
/// never deadlock), decided again from the locked rows, and written.
pub fn take_all<S: StateStore>(store: &mut S, function: &'static str, a: &TakeAllArgs) -> Result<TakeAllDecision> {
    writable(store, function)?;
    let in_call = |e: StoreError| e.in_call(function);
    let states = read_items(store, a, false).map_err(in_call)?;
    let first = multi::decide(a, &states);
    if !first.admitted {
        return Ok(first);
    }
    atomically(store, function, |store| locked_take_all(store, function, a))
}

fn locked_take_all<S: StateStore>(store: &mut S, function: &'static str, a: &TakeAllArgs) -> Result<TakeAllDecision> {
    let in_call = |e: StoreError| e.in_call(function);
    if store.has_row_locks() {
        // A missing row cannot be locked: first insert the row that means the same as none.
        for &i in &a.lock_order {
            match &a.items[i] {
                Item::Bucket(b) => {
                    drop(store.write_bucket(b.key, None, &bucket::untouched(&b.limits)).map_err(in_call)?)
                }
                Item::Budget(b) => drop(
                    store
                        .write_budget(b.key, b.period, None, &budget::untouched(b.period, a.now_ms))
                        .map_err(in_call)?,
                ),
            }
        }
    }
    let states = read_items(store, a, true).map_err(in_call)?;
    let decision = multi::decide(a, &states);
    if decision.admitted {
        for &i in &a.lock_order {
            let written = match (&a.items[i], &states[i], &decision.new_states[i]) {
                (Item::Bucket(b), ItemState::Bucket(old), Some(NewRow::Bucket(new))) => {
                    store.write_bucket(b.key, old.as_ref(), new)
                }
                (Item::Budget(b), ItemState::Budget(old), Some(NewRow::Budget(new))) => {
                    store.write_budget(b.key, b.period, old.as_ref(), new)
                }
                _ => Ok(true),
            }
            .map_err(in_call)?;
            if !written {
                return Err(Error::storage(function, "a row changed while this call held it; nothing was charged"));
            }
        }
    }
    Ok(decision)
}

/// Reads every item's row, in lock order.
fn read_items<S: StateStore>(store: &mut S, a: &TakeAllArgs, lock: bool) -> StoreResult<Vec<ItemState>> {
    let mut states: Vec<Option<ItemState>> = vec![None; a.items.len()];
    for &i in &a.lock_order {
        states[i] = Some(match &a.items[i] {
            Item::Bucket(b) => ItemState::Bucket(store.read_bucket(b.key, lock)?),
            Item::Budget(b) => ItemState::Budget(store.read_budget(b.key, b.period, lock)?),
        });
    }
    Ok(states.into_iter().map(|s| s.expect("lock_order covers every item")).collect())
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
