//! The flows that make each call one atomic read-modify-write over a store
//! ([`crate::store`]): typed arguments in, decisions out. By job: `rows`, the calls on
//! one row (buckets, budgets, windows, leases, sweeps, resets); `take_all`, rl_take_all's
//! several limits as one; `checks`, policies, strikes and blocks. Here: the paths they
//! share.

mod checks;
mod rows;
mod take_all;

pub use checks::{
    block, charge_check, check, check_limits, peek_check, penalize, policy_drop, policy_set, refund_check, unblock,
};
pub use rows::{
    acquire, budgets_near, charge, charge_budget, in_flight, peek, peek_budget, refund, refund_budget, release, renew,
    reset, spend, sweep, take, usage, usage_page, usage_retention, window, window_peek,
};
pub use take_all::{charge_all, refund_all, take_all};

use std::rc::Rc;

use crate::bucket::{self, BucketState, RefundDecision, TakeDecision};
use crate::budget::{self, BudgetCharge, BudgetRefund, BudgetState, SpendDecision};
use crate::call_args::{
    AcquireArgs, BlockArgs, BudgetsNearArgs, CheckArgs, LeaseArgs, PenalizeArgs, RefundBudgetArgs, SpendArgs,
    SweepArgs, TakeAllArgs, TakeArgs, UsageAllArgs, UsageArgs, WindowArgs,
};
use crate::decision_slot::Decide;
use crate::error::{Error, ErrorKind, Result};
use crate::lease::{self, AcquireDecision, Leases, RenewDecision};
use crate::limit_json::LimitShape;
use crate::penalty::{self, BlockAnswer, Escalation, Strikes};
use crate::policy::{self, CheckDecision, LimitRefund, Policy, RefundAllDecision, RefundCheckDecision};
use crate::stats::{self, Outcome};
use crate::store::{
    BudgetAt, Changed, EntriesAt, EntriesRow, EntryKind, PolicyGuard, RowAt, Rows, Store, StoreResult, UsageOf,
};
use crate::take_all::{self as all_or_none, ItemAnswer, ItemRow, Limit, TakeAllDecision};
use crate::window::{self, WindowDecision};

/// Attempts before a call gives up on a row that keeps appearing and disappearing under it
/// (a first insert racing another, a sweep deleting the row between decision and write).
pub const MAX_ATTEMPTS: u32 = 1000;

pub(super) fn writable<S: Store>(store: &mut S, rows: Rows) -> Result<()> {
    let read_only = match rows {
        Rows::Buckets => store.buckets_read_only()?,
        Rows::Budgets | Rows::Entries | Rows::Policies => store.read_only()?,
    };
    if read_only {
        return Err(Error::read_only());
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
               BudgetRefund => BudgetState, BudgetCharge => BudgetState);

/// The one path every single-row change takes: a guarded write that decides on the row
/// the engine is about to change; without a row, decide on none and insert. `decide` is
/// pure, so the answer is read off the row the write last decided on.
pub(super) fn change_row<S, T, R>(
    store: &mut S,
    rows: Rows,
    mut change: impl FnMut(&mut S, Decide<T>) -> StoreResult<Changed<T>>,
    mut insert: impl FnMut(&mut S, &T) -> StoreResult<bool>,
    decide: impl Fn(Option<&T>) -> R + 'static,
) -> Result<R>
where
    S: Store,
    T: Copy + 'static,
    R: RowDecision<T>,
{
    writable(store, rows)?;
    let decide = Rc::new(decide);
    let on_row: Decide<T> = {
        let decide = decide.clone();
        Rc::new(move |row: &T| decide(Some(row)).new_row())
    };
    for _ in 0..MAX_ATTEMPTS {
        let changed = change(store, on_row.clone())?;
        let answer = decide(changed.decided_on.as_ref());
        let new_row = answer.new_row();
        match changed.decided_on {
            Some(_) if new_row.is_some() == changed.written => return Ok(answer),
            // Decided to write, but the row went away before the write (a sweep): again.
            Some(_) => continue,
            None => match new_row {
                None => return Ok(answer),
                Some(new) if insert(store, &new)? => return Ok(answer),
                // Another call inserted the row first: decide on that row.
                Some(_) => continue,
            },
        }
    }
    Err(Error::storage(crate::messages::ROW_KEPT_CHANGING.render(&[&MAX_ATTEMPTS])))
}

pub(super) fn change_bucket<S: Store, R: RowDecision<BucketState>>(
    store: &mut S,
    key: &str,
    decide: impl Fn(Option<&BucketState>) -> R + 'static,
) -> Result<R> {
    change_row(store, Rows::Buckets, |s, d| s.change_bucket(key, d), |s, new| s.insert_bucket(key, new), decide)
}

pub(super) fn change_budget<S: Store, R: RowDecision<BudgetState>>(
    store: &mut S,
    key: &str,
    period: crate::units::Period,
    decide: impl Fn(Option<&BudgetState>) -> R + 'static,
) -> Result<R> {
    let change = |s: &mut S, d: Decide<BudgetState>| {
        let changed = s.change_budget(key, period, d.clone())?;
        if let (true, Some(old)) = (changed.written, changed.decided_on.as_ref()) {
            keep_ended(s, key, period, old, d(old).as_ref())?;
        }
        Ok(changed)
    };
    change_row(store, Rows::Budgets, change, |s, new| s.insert_row(BudgetAt { key, period }, new), decide)
}

/// Keeps `old`'s period for invoicing when writing `new` over it ended that period with
/// something counted ([`budget::ends_counted_period`]).
pub(super) fn keep_ended<S: Store>(
    store: &mut S,
    key: &str,
    period: crate::units::Period,
    old: &BudgetState,
    new: Option<&BudgetState>,
) -> StoreResult<()> {
    match new {
        Some(new) if budget::ends_counted_period(old, new) => {
            store.keep_usage(&budget::UsagePeriod::of(key, period, old))
        }
        _ => Ok(()),
    }
}

/// The row at `at` held for the unit in progress. Where rows are locked one by one a
/// missing row cannot be, so `missing` (a row that answers as none does) is first inserted
/// unless the caller knows the row is there (`may_be_missing` false).
pub(super) fn hold_in_unit<S: Store, A: RowAt>(
    store: &mut S,
    at: A,
    missing: impl FnOnce() -> A::Row,
    may_be_missing: bool,
) -> Result<Option<A::Row>> {
    if S::LOCKS_ROWS && may_be_missing {
        store.insert_row(at, &missing())?;
    }
    Ok(store.hold_row(at)?)
}

/// Writes what a decision on a held row wants (`new`; None: nothing): an insert where
/// there was no row, else a replace of `held`. Returns false if the row changed while held.
pub(super) fn write_held<S: Store, A: RowAt>(
    store: &mut S,
    at: A,
    held: Option<&A::Row>,
    new: Option<&A::Row>,
) -> Result<bool> {
    Ok(match (held, new) {
        (_, None) => true,
        (None, Some(new)) => store.insert_row(at, new)?,
        (Some(old), Some(new)) => store.replace_row(at, old, new)?,
    })
}

/// Runs `work` as one unit (see [`TableRows::begin_unit`]); a failure rolls it back.
pub(super) fn in_one_unit<S: Store, R>(store: &mut S, work: impl FnOnce(&mut S) -> Result<R>) -> Result<R> {
    let owned = store.begin_unit()?;
    let outcome = work(store);
    let finished = store.end_unit(owned, outcome.is_ok()).map_err(Error::from);
    let answer = outcome?;
    finished?;
    Ok(answer)
}

/// Which kind of row a limit changes.
pub(super) fn rows_of(limit: &Limit) -> Rows {
    fn rows<K: take_all::StoredKind>(_: &crate::take_all::Item<K>) -> Rows {
        K::ROWS
    }
    crate::each_kind!(Limit, limit, item => rows(item))
}

/// Fails (read only) unless every kind of row these limits change can be written.
pub(super) fn writable_for<S: Store>(store: &mut S, limits: &[Limit]) -> Result<()> {
    for rows in [Rows::Buckets, Rows::Budgets, Rows::Entries] {
        if limits.iter().any(|l| rows_of(l) == rows) {
            writable(store, rows)?;
        }
    }
    Ok(())
}
