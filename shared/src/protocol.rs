//! The flows that make each call one atomic read-modify-write over a store
//! ([`crate::store`]): typed arguments in, decisions out.

use std::rc::Rc;

use crate::bucket::{self, BucketState, RefundDecision, TakeDecision};
use crate::budget::{self, BudgetCharge, BudgetRefund, BudgetState, SpendDecision};
use crate::call_args::{
    AcquireArgs, BlockArgs, CheckArgs, LeaseArgs, PenalizeArgs, RefundBudgetArgs, SpendArgs, SweepArgs, TakeAllArgs,
    TakeArgs, WindowArgs,
};
use crate::decision_slot::Decide;
use crate::error::{Error, ErrorKind, Result};
use crate::lease::{self, AcquireDecision, Leases, RenewDecision};
use crate::limits::LimitShape;
use crate::multi::{self, ItemAnswer, ItemRow, Limit, TakeAllDecision};
use crate::penalty::{self, BlockAnswer, Escalation, Strikes};
use crate::policy::{self, Policy};
use crate::render::{self, Json, ToJson};
use crate::stats::{self, Outcome};
use crate::store::{Changed, EntriesRow, EntryKind, LockingStore, PolicyGuard, RowStore, Rows, StoreResult};
use crate::window::{self, WindowDecision};

/// Attempts before a call gives up on a row that keeps appearing and disappearing under it
/// (a first insert racing another, a sweep deleting the row between decision and write).
pub const MAX_ATTEMPTS: u32 = 1000;

fn writable<S: RowStore>(store: &mut S, rows: Rows) -> Result<()> {
    if store.read_only(rows)? {
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
fn change_row<S, T, R>(
    store: &mut S,
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
    Err(Error::storage(format!("the row kept changing under {MAX_ATTEMPTS} attempts; try again")))
}

fn change_bucket<S: RowStore, R: RowDecision<BucketState>>(
    store: &mut S,
    key: &str,
    decide: impl Fn(Option<&BucketState>) -> R + 'static,
) -> Result<R> {
    change_row(store, Rows::Buckets, |s, d| s.change_bucket(key, d), |s, new| s.insert_bucket(key, new), decide)
}

fn change_budget<S: RowStore, R: RowDecision<BudgetState>>(
    store: &mut S,
    key: &str,
    period: crate::units::Period,
    decide: impl Fn(Option<&BudgetState>) -> R + 'static,
) -> Result<R> {
    change_row(
        store,
        Rows::Budgets,
        |s, d| s.change_budget(key, period, d),
        |s, new| s.insert_budget(key, period, new),
        decide,
    )
}

/// rl_take: one atomic take.
pub fn take<S: RowStore>(store: &mut S, a: &TakeArgs) -> Result<TakeDecision> {
    let (limits, cost, now) = (a.limits, a.cost, a.now_ms);
    change_bucket(store, a.key, move |row| bucket::take(row, &limits, cost, now))
}

/// rl_refund: give tokens back, never above the burst.
pub fn refund<S: RowStore>(store: &mut S, a: &TakeArgs) -> Result<RefundDecision> {
    let (limits, amount, now) = (a.limits, a.cost, a.now_ms);
    change_bucket(store, a.key, move |row| bucket::refund(row, &limits, amount, now))
}

/// rl_spend: one atomic spend.
pub fn spend<S: RowStore>(store: &mut S, a: &SpendArgs) -> Result<SpendDecision> {
    let (period, quota, cost, now) = (a.period, a.quota, a.cost, a.now_ms);
    change_budget(store, a.key, period, move |row| budget::spend(row, period, quota, cost, now))
}

/// rl_refund_budget: lower what a period used, never below 0.
pub fn refund_budget<S: RowStore>(store: &mut S, a: &RefundBudgetArgs) -> Result<BudgetRefund> {
    let (period, amount, now) = (a.period, a.amount, a.now_ms);
    change_budget(store, a.key, period, move |row| budget::refund(row, period, amount, now))
}

/// rl_charge: take tokens whatever the level, into debt if need be (never deeper than
/// [`crate::units::MAX_TOKENS`]: a range error, nothing charged).
pub fn charge<S: RowStore>(store: &mut S, a: &TakeArgs) -> Result<TakeDecision> {
    let (limits, amount, now) = (a.limits, a.cost, a.now_ms);
    let d = change_bucket(store, a.key, move |row| bucket::charge(row, &limits, amount, now))?;
    if bucket::debt_too_deep(&d) {
        return Err(Error::out_of_range("the bucket's debt would pass 1000000000000000 tokens; nothing was charged"));
    }
    Ok(d)
}

/// rl_charge_budget: add to the period's use, past its quota if need be (never past
/// [`budget::MAX_USED`]: a range error, nothing charged).
pub fn charge_budget<S: RowStore>(store: &mut S, a: &RefundBudgetArgs) -> Result<BudgetCharge> {
    let (period, amount, now) = (a.period, a.amount, a.now_ms);
    let d = change_budget(store, a.key, period, move |row| budget::charge(row, period, amount, now))?;
    if d.too_much {
        return Err(Error::out_of_range(format!(
            "the period's use would pass {} units; nothing was charged",
            budget::MAX_USED / 1_000_000
        )));
    }
    Ok(d)
}

/// rl_peek: what rl_take would answer, changing nothing (so it answers read-only too,
/// from the stored state: on a standby, the replicated one).
pub fn peek<S: RowStore>(store: &mut S, a: &TakeArgs) -> Result<TakeDecision> {
    let row = store.read_bucket(a.key)?;
    Ok(bucket::take(row.as_ref(), &a.limits, a.cost, a.now_ms))
}

/// rl_budget: what rl_spend would answer, spending nothing (read-only too, like rl_peek).
pub fn peek_budget<S: RowStore>(store: &mut S, a: &SpendArgs) -> Result<SpendDecision> {
    let row = store.read_budget(a.key, a.period)?;
    Ok(budget::spend(row.as_ref(), a.period, a.quota, a.cost, a.now_ms))
}

/// rl_sweep: remove at most `max_rows` rows that no longer change any answer, buckets first.
pub fn sweep<S: RowStore>(store: &mut S, a: &SweepArgs) -> Result<i64> {
    writable_everywhere(store)?;
    let mut removed = store.sweep_buckets(a.cutoff_ms, a.max_rows)?;
    if removed < a.max_rows {
        removed += store.sweep_budgets(a.cutoff_ms, a.max_rows - removed)?;
    }
    if removed < a.max_rows {
        removed += store.sweep_entries(a.cutoff_ms, a.max_rows - removed)?;
    }
    Ok(removed)
}

fn writable_everywhere<S: RowStore>(store: &mut S) -> Result<()> {
    for rows in [Rows::Buckets, Rows::Budgets, Rows::Entries] {
        writable(store, rows)?;
    }
    Ok(())
}

/// Runs `work` as one unit (see [`LockingStore::begin_unit`]); a failure rolls it back.
fn in_one_unit<S: LockingStore, R>(store: &mut S, work: impl FnOnce(&mut S) -> Result<R>) -> Result<R> {
    let owned = store.begin_unit()?;
    let outcome = work(store);
    let finished = store.end_unit(owned, outcome.is_ok()).map_err(Error::from);
    let answer = outcome?;
    finished?;
    Ok(answer)
}

/// Fails (read only) unless every kind of row these limits change can be written.
fn writable_for<S: RowStore>(store: &mut S, limits: &[Limit]) -> Result<()> {
    for rows in [Rows::Buckets, Rows::Budgets, Rows::Entries] {
        if limits.iter().any(|l| l.rows() == rows) {
            writable(store, rows)?;
        }
    }
    Ok(())
}

/// rl_reset: forget every bucket, budget, window and lease under a key.
pub fn reset<S: LockingStore>(store: &mut S, key: &str) -> Result<i64> {
    writable_everywhere(store)?;
    in_one_unit(store, |store| store.delete_key(key).map_err(Error::from))
}

/// rl_take_all: every item is charged, or none. An unlocked read answers most refusals
/// without writing; otherwise every budget row is held (in a fixed order, so concurrent
/// calls never deadlock), then the bucket rows are held, everything is decided again from
/// the held rows and the buckets are written; the budgets are written last.
pub fn take_all<'i, 'a, S: LockingStore>(store: &mut S, a: &'i TakeAllArgs<'a>) -> Result<TakeAllDecision<'i, 'a>> {
    writable_for(store, &a.limits)?;
    let first = multi::decide(read_rows(store, a)?, a.now_ms);
    if !first.admitted {
        return Ok(first);
    }
    in_one_unit(store, |store| take_all_held(store, a))
}

fn take_all_held<'i, 'a, S: LockingStore>(store: &mut S, a: &'i TakeAllArgs<'a>) -> Result<TakeAllDecision<'i, 'a>> {
    let mut budgets = Vec::new();
    let mut windows = Vec::new();
    let mut buckets = Vec::new();
    // Limits are sorted buckets, budgets, windows: hold budgets, then windows, then buckets.
    for limit in &a.limits {
        match limit {
            Limit::Bucket(b) => buckets.push(b),
            Limit::Budget(b) => {
                if S::LOCKS_ROWS {
                    // A missing row cannot be locked: first insert the row that means the same as none.
                    store.insert_budget(b.key, b.period, &budget::untouched(b.period, a.now_ms))?;
                }
                budgets.push(store.hold_budget(b.key, b.period)?);
            }
            Limit::Window(w) => {
                if S::LOCKS_ROWS {
                    store.insert_entries(EntryKind::Window, w.key, &empty_row(EntryKind::Window))?;
                }
                let row = store.hold_entries(EntryKind::Window, w.key)?;
                let entries = window_entries(row.as_ref())?;
                windows.push((row, entries));
            }
        }
    }
    let decision = store.decide_buckets(&buckets, |bucket_rows| {
        let (mut bucket_rows, mut budget_rows) = (bucket_rows.iter(), budgets.iter());
        let mut window_rows = windows.iter();
        let rows = a
            .limits
            .iter()
            .map(|limit| match limit {
                Limit::Bucket(b) => ItemRow::Bucket(b, bucket_rows.next().copied().flatten()),
                Limit::Budget(b) => ItemRow::Budget(b, budget_rows.next().copied().flatten()),
                Limit::Window(w) => ItemRow::Window(w, window_rows.next().map(|(_, e)| e.clone()).unwrap_or_default()),
            })
            .collect();
        let decision = multi::decide(rows, a.now_ms);
        let writes = decision
            .items
            .iter()
            .filter_map(|item| match item {
                ItemAnswer::Bucket { answer, .. } => Some(answer.new_state.filter(|_| decision.admitted)),
                ItemAnswer::Budget { .. } | ItemAnswer::Window { .. } => None,
            })
            .collect();
        (writes, decision)
    })?;
    if decision.admitted {
        let mut held_windows = windows.iter();
        for item in &decision.items {
            let written = match item {
                ItemAnswer::Bucket { .. } => true,
                ItemAnswer::Budget { item, row, answer } => match (row, &answer.new_state) {
                    (_, None) => true,
                    (None, Some(new)) => store.insert_budget(item.key, item.period, new)?,
                    (Some(old), Some(new)) => store.replace_budget(item.key, item.period, old, new)?,
                },
                ItemAnswer::Window { item, answer, .. } => {
                    let (old, _) = held_windows.next().expect("one held row per window");
                    let new = window_row(answer, item.limits.window_ms)?;
                    match (old, new) {
                        (_, None) => true,
                        (None, Some(new)) => store.insert_entries(EntryKind::Window, item.key, &new)?,
                        (Some(old), Some(new)) => store.replace_entries(EntryKind::Window, item.key, old, &new)?,
                    }
                }
            };
            if !written {
                return Err(Error::storage("a row changed while this call held it; nothing was charged"));
            }
        }
    }
    Ok(decision)
}

/// Every limit with its row as it stands, in the order of `a.limits`.
fn read_rows<'i, 'a, S: LockingStore>(store: &mut S, a: &'i TakeAllArgs<'a>) -> Result<Vec<ItemRow<'i, 'a>>> {
    a.limits
        .iter()
        .map(|limit| {
            Ok(match limit {
                Limit::Bucket(b) => ItemRow::Bucket(b, store.read_bucket(b.key)?),
                Limit::Budget(b) => ItemRow::Budget(b, store.read_budget(b.key, b.period)?),
                Limit::Window(w) => {
                    let row = store.read_entries(EntryKind::Window, w.key)?;
                    ItemRow::Window(w, window_entries(row.as_ref())?)
                }
            })
        })
        .collect()
}

fn damaged(kind: EntryKind) -> Error {
    Error::storage(format!("a stored {} row is damaged; rl_reset its key", kind.as_str()))
}

/// The entries of a window row (none without a row).
fn window_entries(row: Option<&EntriesRow>) -> Result<Vec<window::Entry>> {
    row.map_or(Some(Vec::new()), |r| window::decode(&r.entries)).ok_or_else(|| damaged(EntryKind::Window))
}

/// The leases of a lease row (none without a row).
fn leases_of(row: Option<&EntriesRow>) -> Result<Leases> {
    row.map_or(Some(Leases::default()), |r| Leases::decode(&r.entries)).ok_or_else(|| damaged(EntryKind::Lease))
}

/// The row an admitted window decision stores, within the bound on entries per key.
fn window_row(d: &WindowDecision, window_ms: i64) -> Result<Option<EntriesRow>> {
    let Some(entries) = &d.new_entries else { return Ok(None) };
    if entries.len() > window::MAX_ENTRIES {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!(
                "the window would hold more than {} entries (one per millisecond with admissions); \
                 nothing was recorded: use a larger cost per call or a bucket for this limit",
                window::MAX_ENTRIES
            ),
        ));
    }
    Ok(Some(EntriesRow { entries: window::encode(entries), empty_at: window::empty_at(entries, window_ms) }))
}

fn lease_row(leases: Leases) -> EntriesRow {
    EntriesRow { entries: leases.encode(), empty_at: leases.empty_at() }
}

/// The one path of every change to a row of entries: decide on the row as it stands and,
/// if that writes, decide again on the row held in one unit and write that. `decide` is
/// pure and gives the answer and the row to write (None: nothing).
fn change_entries<S: LockingStore, R>(
    store: &mut S,
    kind: EntryKind,
    key: &str,
    decide: impl Fn(Option<&EntriesRow>) -> Result<(R, Option<EntriesRow>)>,
) -> Result<R> {
    writable(store, Rows::Entries)?;
    let seen = store.read_entries(kind, key)?;
    let (answer, new) = decide(seen.as_ref())?;
    if new.is_none() {
        return Ok(answer);
    }
    in_one_unit(store, |store| {
        for _ in 0..MAX_ATTEMPTS {
            if S::LOCKS_ROWS && seen.is_none() {
                // A missing row cannot be locked: first insert the row that means the same as none.
                store.insert_entries(kind, key, &empty_row(kind))?;
            }
            let held = store.hold_entries(kind, key)?;
            let (answer, new) = decide(held.as_ref())?;
            let written = match (&held, &new) {
                (_, None) => true,
                (None, Some(new)) => store.insert_entries(kind, key, new)?,
                (Some(old), Some(new)) => store.replace_entries(kind, key, old, new)?,
            };
            if written {
                return Ok(answer);
            }
        }
        Err(Error::storage(format!("the row kept changing under {MAX_ATTEMPTS} attempts; try again")))
    })
}

/// The row that answers exactly as no row does: an empty list, removable by the sweep.
fn empty_row(kind: EntryKind) -> EntriesRow {
    let entries = match kind {
        EntryKind::Window => window::encode(&[]),
        EntryKind::Lease => Leases::default().encode(),
        EntryKind::Block => Strikes::default().encode(),
    };
    EntriesRow { entries, empty_at: 0 }
}

/// rl_window: one atomic admission to a sliding window.
pub fn window<S: LockingStore>(store: &mut S, a: &WindowArgs) -> Result<WindowDecision> {
    change_entries(store, EntryKind::Window, a.key, |row| {
        let d = window::take(&window_entries(row)?, &a.limits, a.cost, a.now_ms);
        let new = window_row(&d, a.limits.window_ms)?;
        Ok((d, new))
    })
}

/// rl_window_peek: what rl_window would answer, recording nothing (read-only too).
pub fn window_peek<S: RowStore>(store: &mut S, a: &WindowArgs) -> Result<WindowDecision> {
    let row = store.read_entries(EntryKind::Window, a.key)?;
    Ok(window::take(&window_entries(row.as_ref())?, &a.limits, a.cost, a.now_ms))
}

/// rl_acquire: hold one more lease if fewer than the cap are held.
pub fn acquire<S: LockingStore>(store: &mut S, a: &AcquireArgs) -> Result<AcquireDecision> {
    change_entries(store, EntryKind::Lease, a.key, |row| {
        let mut d = lease::acquire(&leases_of(row)?, a.max_in_flight, a.lease_ms, a.now_ms);
        let new = d.new_state.take().map(lease_row);
        Ok((d, new))
    })
}

/// rl_release: give a lease back; whether it was held.
pub fn release<S: LockingStore>(store: &mut S, a: &LeaseArgs) -> Result<bool> {
    change_entries(store, EntryKind::Lease, a.key, |row| {
        let (released, new) = lease::release(&leases_of(row)?, a.lease, a.now_ms);
        Ok((released, new.map(lease_row)))
    })
}

/// rl_renew: a held lease expires lease_seconds from now.
pub fn renew<S: LockingStore>(store: &mut S, a: &LeaseArgs) -> Result<RenewDecision> {
    let lease_ms = a.lease_ms.expect("rl_renew parses lease_seconds");
    change_entries(store, EntryKind::Lease, a.key, |row| {
        let mut d = lease::renew(&leases_of(row)?, a.lease, lease_ms, a.now_ms);
        let new = d.new_state.take().map(lease_row);
        Ok((d, new))
    })
}

/// rl_in_flight: the leases held on a key now (read-only too).
pub fn in_flight<S: RowStore>(store: &mut S, key: &str, now_ms: i64) -> Result<i64> {
    let row = store.read_entries(EntryKind::Lease, key)?;
    Ok(leases_of(row.as_ref())?.in_flight(now_ms))
}

/// rl_policy_set: validates a whole definition, stores it in its canonical form and
/// returns that.
pub fn policy_set<S: RowStore>(store: &mut S, name: &str, definition: &str) -> Result<Policy> {
    let policy = Policy::parse(definition)?;
    writable(store, Rows::Policies)?;
    let revision = policy::new_revision();
    store.put_policy(name, &policy.to_json().to_text(), revision)?;
    policy::forget(name);
    Ok(policy)
}

/// rl_policy_drop: whether the policy existed.
pub fn policy_drop<S: RowStore>(store: &mut S, name: &str) -> Result<bool> {
    writable(store, Rows::Policies)?;
    let existed = store.delete_policy(name)?;
    policy::forget(name);
    Ok(existed)
}

/// rl_check: every limit of a policy on a subject, all or nothing, as rl_take_all decides
/// them. A shadow policy changes state exactly as enforcement would (charged when it would
/// admit, untouched when it would refuse) and reports the refusal it would have made.
pub fn check<S: LockingStore>(store: &mut S, a: &CheckArgs) -> Result<Json> {
    if let Some(answer) = check_one_bucket(store, a)? {
        return Ok(answer);
    }
    let policy = stored_policy(store, a.policy)?;
    let multiplier = policy.multiplier(a.tier)?;
    let keys = policy.keys(a.policy, a.subject);
    let blocked = strikes_of(store, a.subject)?.block_at(a.now_ms);
    // A blocked subject is refused, charging nothing: every limit as it is now (cost 0).
    let cost = if blocked.is_some() { 0.0 } else { a.cost };
    let mut limits = policy.items(&keys, multiplier, cost);
    limits.sort_by(|x, y| x.row().cmp(&y.row()));
    let args = TakeAllArgs { limits, now_ms: a.now_ms };
    let decision = match blocked {
        None => take_all(store, &args)?,
        Some(_) => multi::decide(read_rows(store, &args)?, a.now_ms),
    };
    let outcome = match (policy.shadow, blocked.is_some() || !decision.admitted) {
        (_, false) => Outcome::Admitted,
        (true, true) => Outcome::WouldRefuse,
        (false, true) if blocked.is_some() => Outcome::RefusedBlocked,
        (false, true) => Outcome::Refused,
    };
    stats::sink().count(a.policy, outcome);
    Ok(render::check(&decision, a.policy, a.tier, policy.shadow, blocked, a.now_ms))
}

/// A policy as stored now, parsed (or from the connection's cache when unchanged). At a
/// checks epoch this thread has not listed the blocked subjects at, it lists them too, for
/// rl_check's one-statement path.
fn stored_policy<S: RowStore>(store: &mut S, name: &str) -> Result<Rc<Policy>> {
    let epoch = store.checks_epoch();
    let stored = store.read_policy(name)?;
    let Some(stored) = stored else {
        return Err(Error::invalid(format!("there is no policy named '{name}'")));
    };
    let strike_rows = match epoch {
        Some(e) if !policy::blocks_known_at(e) => store.read_strike_rows(policy::KNOWN_STRIKE_ROWS + 1)?,
        _ => None,
    };
    let epoch = epoch.filter(|&e| store.checks_epoch() == Some(e));
    if let (Some(e), Some(rows)) = (epoch, strike_rows) {
        policy::know_blocks(e, rows);
    }
    policy::parsed(name, &stored, epoch)
}

/// rl_refund_check: gives `cost` back to every limit of a policy for a subject, at the
/// tier's scale (a handler failed after rl_check admitted it), all in one unit: buckets
/// never above their burst, budgets never below 0, windows by forgetting the newest
/// admissions that still count. Each item answers as rl_refund, rl_refund_budget and
/// rl_window_peek do.
pub fn refund_check<S: LockingStore>(store: &mut S, a: &CheckArgs) -> Result<Json> {
    let policy = stored_policy(store, a.policy)?;
    let multiplier = policy.multiplier(a.tier)?;
    let keys = policy.keys(a.policy, a.subject);
    let limits = policy.items(&keys, multiplier, a.cost);
    writable_for(store, &limits)?;
    let now_ms = a.now_ms;
    let items = in_one_unit(store, |store| {
        let item = |store: &mut S, limit: &Limit| -> Result<Json> {
            Ok(match limit {
                Limit::Bucket(b) => {
                    refund(store, &TakeArgs { key: b.key, limits: b.limits, cost: b.cost, now_ms })?.to_json()
                }
                Limit::Budget(b) => {
                    let args = RefundBudgetArgs { key: b.key, period: b.period, amount: b.cost, now_ms };
                    refund_budget(store, &args)?.to_json()
                }
                Limit::Window(w) => change_entries(store, EntryKind::Window, w.key, |row| {
                    let given_back = window::refund(&window_entries(row)?, w.cost);
                    // a peek (cost 0) answers the window as the refund left it, and keeps
                    // only the entries that still count
                    let d = window::take(&given_back, &w.limits, 0, now_ms);
                    let new = window_row(&d, w.limits.window_ms)?;
                    Ok((d, new))
                })?
                .to_json(),
            })
        };
        limits.iter().map(|l| item(store, l)).collect::<Result<Vec<Json>>>()
    })?;
    Ok(render::refund_check(a.policy, a.tier, items))
}

/// rl_check of a cached one-bucket policy on an unblocked subject, as rl_take is: one
/// guarded write. At the checks epoch the policy was read at, with the subject known to
/// have no recorded block, the write needs only the epoch unmoved (rl_take's own write
/// where the store keeps the epoch in memory); else its statement also finds the policy at
/// its revision and no strikes or block on the subject. None when nothing was written (a
/// refusal, a new key, a moved epoch, a changed policy, strikes, or a store that cannot):
/// the general path decides then.
fn check_one_bucket<S: LockingStore>(store: &mut S, a: &CheckArgs) -> Result<Option<Json>> {
    let Some(cached) = policy::cached(a.policy) else { return Ok(None) };
    let policy = cached.policy;
    let ([LimitShape::Bucket { .. }], Ok(multiplier)) = (policy.limits.as_slice(), policy.multiplier(a.tier)) else {
        return Ok(None);
    };
    let keys = [Policy::key(a.policy, a.subject, 0)];
    let limits = policy.items(&keys, multiplier, a.cost);
    let Limit::Bucket(item) = &limits[0] else { unreachable!("a bucket policy gives a bucket item") };
    writable(store, Rows::Buckets)?;
    let (bucket_limits, cost, now) = (item.limits, item.cost, a.now_ms);
    let decide: Decide<BucketState> = Rc::new(move |row| bucket::take(Some(row), &bucket_limits, cost, now).new_row());
    let epoch = cached.epoch.filter(|&e| policy::known_unblocked(e, a.subject));
    let guard =
        PolicyGuard { policy: a.policy, revision: cached.revision, subject: a.subject, now_ms: a.now_ms, epoch };
    let changed = store.change_bucket_for_policy(&keys[0], &guard, decide)?;
    let Changed { decided_on: Some(row), written: true } = changed else { return Ok(None) };
    let decision = multi::decide(vec![ItemRow::Bucket(item, Some(row))], a.now_ms);
    stats::sink().count(a.policy, Outcome::Admitted);
    Ok(Some(render::check(&decision, a.policy, a.tier, policy.shadow, None, a.now_ms)))
}

fn strikes_of<S: RowStore>(store: &mut S, subject: &str) -> Result<Strikes> {
    let row = store.read_entries(EntryKind::Block, subject)?;
    row.map_or(Some(Strikes::default()), |r| Strikes::decode(&r.entries)).ok_or_else(|| damaged(EntryKind::Block))
}

/// A change to a subject's strikes: `decide` gets the stored state and when its row stops
/// mattering, and gives the answer and the state to store with its row's `empty_at`. A
/// write that gives the subject a recorded block moves the checks epoch.
fn change_strikes<S: LockingStore, R>(
    store: &mut S,
    subject: &str,
    decide: impl Fn(Option<&Strikes>, i64) -> (R, Option<(Strikes, i64)>),
) -> Result<R> {
    let (answer, new_block) = change_entries(store, EntryKind::Block, subject, |row| {
        let state = row.map(|r| Strikes::decode(&r.entries).ok_or_else(|| damaged(EntryKind::Block)));
        let state = state.transpose()?;
        let (answer, new) = decide(state.as_ref(), row.map_or(0, |r| r.empty_at));
        let new_block = new.as_ref().is_some_and(|(n, _)| penalty::records_new_block(state.as_ref(), n));
        let new = new.map(|(n, empty_at)| EntriesRow { entries: n.encode(), empty_at });
        Ok(((answer, new_block), new))
    })?;
    if new_block {
        store.checks_changed()?;
        // this thread's own list is stale at once (the epoch may only move at the end of
        // the statement)
        policy::forget_blocks();
    }
    Ok(answer)
}

/// rl_penalize: one strike; past the free ones, a block that doubles with each.
pub fn penalize<S: LockingStore>(store: &mut S, a: &PenalizeArgs) -> Result<BlockAnswer> {
    let e: Escalation = a.escalation;
    change_strikes(store, a.subject, |state, _| {
        // strikes are remembered window_ms after the last
        let (answer, new) = penalty::penalize(state, &e, a.now_ms);
        (answer, Some((new, new.empty_at())))
    })
}

/// rl_block: a block for `seconds`, or until rl_unblock.
pub fn block<S: LockingStore>(store: &mut S, a: &BlockArgs) -> Result<BlockAnswer> {
    change_strikes(store, a.subject, |state, kept_until| {
        let (answer, new) = penalty::block(state, a.length_ms, a.now_ms);
        // a row from before forgotten_at was recorded keeps the end its rl_penalize gave it
        (answer, Some((new, new.empty_at().max(kept_until))))
    })
}

/// rl_unblock: lifts a block and forgets strikes; whether a block was in force.
pub fn unblock<S: LockingStore>(store: &mut S, subject: &str, now_ms: i64) -> Result<bool> {
    change_strikes(store, subject, |state, _| match state {
        None => (false, None),
        // the empty state's row stops mattering at once: the sweep removes it
        Some(s) => (s.block_at(now_ms).is_some(), Some((Strikes::default(), 0))),
    })
}
