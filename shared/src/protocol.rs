//! The flows that make each call one atomic read-modify-write over a store
//! ([`crate::store`]): typed arguments in, decisions out.

use std::rc::Rc;

use crate::args::{RefundBudgetArgs, SpendArgs, SweepArgs, TakeAllArgs, TakeArgs};
use crate::bucket::{self, BucketState, RefundDecision, TakeDecision};
use crate::budget::{self, BudgetRefund, BudgetState, SpendDecision};
use crate::decision_slot::Decide;
use crate::error::{Error, Result};
use crate::multi::{self, ItemAnswer, ItemRow, Limit, TakeAllDecision};
use crate::store::{Changed, LockingStore, RowStore, Rows, StoreError, StoreResult};

/// Attempts before a call gives up on a row that keeps appearing and disappearing under it
/// (a first insert racing another, a sweep deleting the row between decision and write).
pub const MAX_ATTEMPTS: u32 = 1000;

impl StoreError {
    fn in_call(self, function: &'static str) -> Error {
        let mut e = Error::storage(function, self.message);
        e.engine_code = self.engine_code;
        e
    }
}

fn writable<S: RowStore>(store: &mut S, function: &'static str, rows: Rows) -> Result<()> {
    if store.read_only(rows).map_err(|e| e.in_call(function))? {
        return Err(Error::read_only(function));
    }
    Ok(())
}

/// A decision on one row: the answer, and the row it wants written (None: write nothing).
pub trait RowDecision<T>: Sized {
    fn new_row(&self) -> Option<T>;
}

macro_rules! row_decisions {
    ($($decision:ty => $row:ty),*) => {$(
        impl RowDecision<$row> for $decision {
            fn new_row(&self) -> Option<$row> {
                self.new_state
            }
        }
    )*};
}

row_decisions!(TakeDecision => BucketState, RefundDecision => BucketState, SpendDecision => BudgetState,
               BudgetRefund => BudgetState);

/// The one path every single-row change takes: a guarded write that decides on the row
/// the engine is about to change; without a row, decide on none and insert. `decide` is
/// pure, so the answer is read off the row the write last decided on.
fn change_row<S, T, R>(
    store: &mut S,
    function: &'static str,
    rows: Rows,
    mut change: impl FnMut(&mut S, Decide<T>) -> StoreResult<Changed<T>>,
    mut insert: impl FnMut(&mut S, &T) -> StoreResult<bool>,
    decide: impl Fn(Option<&T>) -> R + 'static,
) -> Result<R>
where
    S: RowStore,
    T: Copy + 'static,
    R: RowDecision<T>,
{
    writable(store, function, rows)?;
    let in_call = |e: StoreError| e.in_call(function);
    let decide = Rc::new(decide);
    let on_row: Decide<T> = {
        let decide = decide.clone();
        Rc::new(move |row: &T| decide(Some(row)).new_row())
    };
    for _ in 0..MAX_ATTEMPTS {
        let changed = change(store, on_row.clone()).map_err(in_call)?;
        let answer = decide(changed.decided_on.as_ref());
        let new_row = answer.new_row();
        match changed.decided_on {
            Some(_) if new_row.is_some() == changed.written => return Ok(answer),
            // Decided to write, but the row went away before the write (a sweep): again.
            Some(_) => continue,
            None => match new_row {
                None => return Ok(answer),
                Some(new) if insert(store, &new).map_err(in_call)? => return Ok(answer),
                // Another call inserted the row first: decide on that row.
                Some(_) => continue,
            },
        }
    }
    Err(Error::storage(function, format!("the row kept changing under {MAX_ATTEMPTS} attempts; try again")))
}

fn change_bucket<S: RowStore, R: RowDecision<BucketState>>(
    store: &mut S,
    function: &'static str,
    key: &str,
    decide: impl Fn(Option<&BucketState>) -> R + 'static,
) -> Result<R> {
    change_row(
        store,
        function,
        Rows::Buckets,
        |s, d| s.change_bucket(key, d),
        |s, new| s.insert_bucket(key, new),
        decide,
    )
}

fn change_budget<S: RowStore, R: RowDecision<BudgetState>>(
    store: &mut S,
    function: &'static str,
    key: &str,
    period: crate::units::Period,
    decide: impl Fn(Option<&BudgetState>) -> R + 'static,
) -> Result<R> {
    change_row(
        store,
        function,
        Rows::Budgets,
        |s, d| s.change_budget(key, period, d),
        |s, new| s.insert_budget(key, period, new),
        decide,
    )
}

/// rl_take: one atomic take.
pub fn take<S: RowStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<TakeDecision> {
    let (limits, cost, now) = (a.limits, a.cost, a.now_ms);
    change_bucket(store, function, a.key, move |row| bucket::take(row, &limits, cost, now))
}

/// rl_refund: give tokens back, never above the burst.
pub fn refund<S: RowStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<RefundDecision> {
    let (limits, amount, now) = (a.limits, a.cost, a.now_ms);
    change_bucket(store, function, a.key, move |row| bucket::refund(row, &limits, amount, now))
}

/// rl_spend: one atomic spend.
pub fn spend<S: RowStore>(store: &mut S, function: &'static str, a: &SpendArgs) -> Result<SpendDecision> {
    let (period, quota, cost, now) = (a.period, a.quota, a.cost, a.now_ms);
    change_budget(store, function, a.key, period, move |row| budget::spend(row, period, quota, cost, now))
}

/// rl_refund_budget: lower what a period used, never below 0.
pub fn refund_budget<S: RowStore>(store: &mut S, function: &'static str, a: &RefundBudgetArgs) -> Result<BudgetRefund> {
    let (period, amount, now) = (a.period, a.amount, a.now_ms);
    change_budget(store, function, a.key, period, move |row| budget::refund(row, period, amount, now))
}

/// rl_peek: what rl_take would answer, changing nothing (so it answers read-only too,
/// from the stored state: on a standby, the replicated one).
pub fn peek<S: RowStore>(store: &mut S, function: &'static str, a: &TakeArgs) -> Result<TakeDecision> {
    let row = store.read_bucket(a.key).map_err(|e| e.in_call(function))?;
    Ok(bucket::take(row.as_ref(), &a.limits, a.cost, a.now_ms))
}

/// rl_budget: what rl_spend would answer, spending nothing (read-only too, like rl_peek).
pub fn peek_budget<S: RowStore>(store: &mut S, function: &'static str, a: &SpendArgs) -> Result<SpendDecision> {
    let row = store.read_budget(a.key, a.period).map_err(|e| e.in_call(function))?;
    Ok(budget::spend(row.as_ref(), a.period, a.quota, a.cost, a.now_ms))
}

/// rl_sweep: remove at most `max_rows` rows that no longer change any answer, buckets first.
pub fn sweep<S: RowStore>(store: &mut S, function: &'static str, a: &SweepArgs) -> Result<i64> {
    writable(store, function, Rows::Buckets)?;
    writable(store, function, Rows::Budgets)?;
    let in_call = |e: StoreError| e.in_call(function);
    let buckets = store.sweep_buckets(a.cutoff_ms, a.max_rows).map_err(in_call)?;
    if buckets >= a.max_rows {
        return Ok(buckets);
    }
    let budgets = store.sweep_budgets(a.cutoff_ms, a.max_rows - buckets).map_err(in_call)?;
    Ok(buckets + budgets)
}

/// Runs `work` as one unit (see [`LockingStore::begin_unit`]); a failure rolls it back.
fn in_one_unit<S: LockingStore, R>(
    store: &mut S,
    function: &'static str,
    work: impl FnOnce(&mut S) -> Result<R>,
) -> Result<R> {
    let owned = store.begin_unit().map_err(|e| e.in_call(function))?;
    let outcome = work(store);
    let finished = store.end_unit(owned, outcome.is_ok()).map_err(|e| e.in_call(function));
    let answer = outcome?;
    finished?;
    Ok(answer)
}

/// rl_reset: forget every bucket and budget under a key.
pub fn reset<S: LockingStore>(store: &mut S, function: &'static str, key: &str) -> Result<i64> {
    writable(store, function, Rows::Buckets)?;
    writable(store, function, Rows::Budgets)?;
    in_one_unit(store, function, |store| store.delete_key(key).map_err(|e| e.in_call(function)))
}

/// rl_take_all: every item is charged, or none. An unlocked read answers most refusals
/// without writing; otherwise every budget row is held (in a fixed order, so concurrent
/// calls never deadlock), then the bucket rows are held, everything is decided again from
/// the held rows and the buckets are written; the budgets are written last.
pub fn take_all<'i, 'a, S: LockingStore>(
    store: &mut S,
    function: &'static str,
    a: &'i TakeAllArgs<'a>,
) -> Result<TakeAllDecision<'i, 'a>> {
    for rows in [Rows::Buckets, Rows::Budgets] {
        if a.limits.iter().any(|l| l.rows() == rows) {
            writable(store, function, rows)?;
        }
    }
    let first = multi::decide(read_rows(store, a).map_err(|e| e.in_call(function))?, a.now_ms);
    if !first.admitted {
        return Ok(first);
    }
    in_one_unit(store, function, |store| take_all_held(store, function, a))
}

fn take_all_held<'i, 'a, S: LockingStore>(
    store: &mut S,
    function: &'static str,
    a: &'i TakeAllArgs<'a>,
) -> Result<TakeAllDecision<'i, 'a>> {
    let in_call = |e: StoreError| e.in_call(function);
    let mut budgets = Vec::new();
    let mut buckets = Vec::new();
    for limit in &a.limits {
        match limit {
            Limit::Bucket(b) => buckets.push(b),
            Limit::Budget(b) => {
                if S::LOCKS_ROWS {
                    // A missing row cannot be locked: first insert the row that means the same as none.
                    store.insert_budget(b.key, b.period, &budget::untouched(b.period, a.now_ms)).map_err(in_call)?;
                }
                budgets.push(store.hold_budget(b.key, b.period).map_err(in_call)?);
            }
        }
    }
    let decision = store
        .decide_buckets(&buckets, |bucket_rows| {
            let (mut bucket_rows, mut budget_rows) = (bucket_rows.iter(), budgets.iter());
            let rows = a
                .limits
                .iter()
                .map(|limit| match limit {
                    Limit::Bucket(b) => ItemRow::Bucket(b, bucket_rows.next().copied().flatten()),
                    Limit::Budget(b) => ItemRow::Budget(b, budget_rows.next().copied().flatten()),
                })
                .collect();
            let decision = multi::decide(rows, a.now_ms);
            let writes = decision
                .items
                .iter()
                .filter_map(|item| match item {
                    ItemAnswer::Bucket { answer, .. } => Some(answer.new_state.filter(|_| decision.admitted)),
                    ItemAnswer::Budget { .. } => None,
                })
                .collect();
            (writes, decision)
        })
        .map_err(in_call)?;
    if decision.admitted {
        for item in &decision.items {
            let ItemAnswer::Budget { item, row, answer } = item else { continue };
            let written = match (row, &answer.new_state) {
                (_, None) => true,
                (None, Some(new)) => store.insert_budget(item.key, item.period, new).map_err(in_call)?,
                (Some(old), Some(new)) => store.replace_budget(item.key, item.period, old, new).map_err(in_call)?,
            };
            if !written {
                return Err(Error::storage(function, "a row changed while this call held it; nothing was charged"));
            }
        }
    }
    Ok(decision)
}

/// Every limit with its row as it stands, in the order of `a.limits`.
fn read_rows<'i, 'a, S: LockingStore>(store: &mut S, a: &'i TakeAllArgs<'a>) -> StoreResult<Vec<ItemRow<'i, 'a>>> {
    a.limits
        .iter()
        .map(|limit| {
            Ok(match limit {
                Limit::Bucket(b) => ItemRow::Bucket(b, store.read_bucket(b.key)?),
                Limit::Budget(b) => ItemRow::Budget(b, store.read_budget(b.key, b.period)?),
            })
        })
        .collect()
}
