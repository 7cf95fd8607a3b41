//! The calls on one row: buckets, budgets, windows and leases, and the sweeps and resets.

use super::*;
use crate::messages as msg;

/// rl_take: one atomic take.
pub fn take<S: Store>(store: &mut S, a: &TakeArgs) -> Result<TakeDecision> {
    let (limits, cost, now) = (a.limits, a.cost, a.now_ms);
    change_bucket(store, a.key, move |row| bucket::take(row, &limits, cost, now))
}

/// rl_refund: give tokens back, never above the burst.
pub fn refund<S: Store>(store: &mut S, a: &TakeArgs) -> Result<RefundDecision> {
    let (limits, amount, now) = (a.limits, a.cost, a.now_ms);
    change_bucket(store, a.key, move |row| bucket::refund(row, &limits, amount, now))
}

/// rl_spend: one atomic spend.
pub fn spend<S: Store>(store: &mut S, a: &SpendArgs) -> Result<SpendDecision> {
    let (period, quota, cost, now) = (a.period, a.quota, a.cost, a.now_ms);
    change_budget(store, a.key, period, move |row| budget::spend(row, period, quota, cost, now))
}

/// rl_refund_budget: lower what a period used, never below 0.
pub fn refund_budget<S: Store>(store: &mut S, a: &RefundBudgetArgs) -> Result<BudgetRefund> {
    let (period, amount, now) = (a.period, a.amount, a.now_ms);
    change_budget(store, a.key, period, move |row| budget::refund(row, period, amount, now))
}

/// rl_charge: take tokens whatever the level, into debt if need be (never deeper than
/// [`crate::units::MAX_TOKENS`]: a range error, nothing charged).
pub fn charge<S: Store>(store: &mut S, a: &TakeArgs) -> Result<TakeDecision> {
    let (limits, amount, now) = (a.limits, a.cost, a.now_ms);
    let d = change_bucket(store, a.key, move |row| bucket::charge(row, &limits, amount, now))?;
    if bucket::debt_too_deep(&d) {
        return Err(Error::out_of_range(msg::DEBT_TOO_DEEP.render(&[&(crate::units::MAX_TOKENS as i64)])));
    }
    Ok(d)
}

/// rl_charge_budget: add to the period's use, past its quota if need be (never past
/// [`budget::MAX_USED`]: a range error, nothing charged).
pub fn charge_budget<S: Store>(store: &mut S, a: &RefundBudgetArgs) -> Result<BudgetCharge> {
    let (period, amount, now) = (a.period, a.amount, a.now_ms);
    let d = change_budget(store, a.key, period, move |row| budget::charge(row, period, amount, now))?;
    if d.too_much {
        return Err(Error::out_of_range(msg::USE_TOO_HIGH.render(&[&(budget::MAX_USED / 1_000_000)])));
    }
    Ok(d)
}

/// rl_peek: what rl_take would answer, changing nothing (so it answers read-only too,
/// from the stored state: on a standby, the replicated one).
pub fn peek<S: Store>(store: &mut S, a: &TakeArgs) -> Result<TakeDecision> {
    let row = store.read_bucket(a.key)?;
    Ok(bucket::take(row.as_ref(), &a.limits, a.cost, a.now_ms))
}

/// rl_budget: what rl_spend would answer, spending nothing (read-only too, like rl_peek).
pub fn peek_budget<S: Store>(store: &mut S, a: &SpendArgs) -> Result<SpendDecision> {
    let row = store.read_row(BudgetAt { key: a.key, period: a.period })?;
    Ok(budget::spend(row.as_ref(), a.period, a.quota, a.cost, a.now_ms))
}

/// rl_budgets_near: the budgets of the current period that used at least `fraction` of the
/// quota their last spend gave (read-only, like rl_budget).
pub fn budgets_near<S: Store>(store: &mut S, a: &BudgetsNearArgs) -> Result<budget::BudgetsNear> {
    let budgets = store.budgets_near(a.fraction, a.now_ms, a.n)?;
    Ok(budget::BudgetsNear { fraction: a.fraction, budgets })
}

/// rl_usage: the ended periods kept for `key` in a range (read-only, like rl_budget).
pub fn usage<S: Store>(store: &mut S, a: &UsageArgs) -> Result<budget::Usage> {
    let most = budget::MAX_USAGE_PERIODS;
    let periods = store.read_usage(UsageOf::Key(a.key), a.from_ms, a.to_ms, most + 1)?;
    if periods.len() as i64 > most {
        return Err(Error::new(ErrorKind::LimitExceeded, msg::USAGE_TOO_MANY.render(&[&most])));
    }
    Ok(budget::Usage { key: a.key.to_owned(), from_ms: a.from_ms, to_ms: a.to_ms, periods })
}

/// rl_usage_all: a page of every key's kept periods in a range, after the cursor of an
/// earlier page (read-only, like rl_budgets_near); `next` only when more follow.
pub fn usage_page<S: Store>(store: &mut S, a: &UsageAllArgs) -> Result<budget::UsagePage> {
    let of = UsageOf::Every { after: a.after.as_ref() };
    let mut periods = store.read_usage(of, a.from_ms, a.to_ms, a.n + 1)?;
    let more = periods.len() as i64 > a.n;
    periods.truncate(a.n as usize);
    let next = if more { periods.last().map(budget::UsageCursor::at) } else { None };
    Ok(budget::UsagePage { from_ms: a.from_ms, to_ms: a.to_ms, periods, next })
}

/// rl_usage_retention: how many days rl_sweep keeps ended periods; with `days`, set first
/// (an administrator's call: it decides how long invoices can be made).
pub fn usage_retention<S: Store>(store: &mut S, days: Option<i64>) -> Result<i64> {
    let day = crate::units::MS_PER_DAY;
    if let Some(days) = days {
        writable(store, Rows::Budgets)?;
        store.write_setting(budget::USAGE_RETENTION_SETTING, days * day)?;
        return Ok(days);
    }
    Ok(usage_kept_ms(store)? / day)
}

/// How long rl_sweep keeps ended periods, in ms: the setting, else [`budget::USAGE_KEPT_MS`].
fn usage_kept_ms<S: Store>(store: &mut S) -> Result<i64> {
    Ok(store.read_setting(budget::USAGE_RETENTION_SETTING)?.unwrap_or(budget::USAGE_KEPT_MS))
}

/// rl_sweep: remove at most `max_rows` rows that no longer change any answer, buckets first.
pub fn sweep<S: Store>(store: &mut S, a: &SweepArgs) -> Result<i64> {
    writable_everywhere(store)?;
    let mut removed = store.sweep_buckets(a.cutoff_ms, a.max_rows)?;
    if removed < a.max_rows {
        // an ended period with something counted is kept for invoicing first: the
        // statement removes only those kept, or with nothing counted
        let ended = store.ended_budgets(a.cutoff_ms, a.max_rows - removed)?;
        for (key, period, row) in &ended {
            if let Ok(period) = crate::args::period(&crate::args::Arg::Text(period)) {
                store.keep_usage(&budget::UsagePeriod::of(key, period, row))?;
            }
        }
        removed += store.sweep_rows::<BudgetState>(a.cutoff_ms, a.max_rows - removed)?;
    }
    if removed < a.max_rows {
        removed += store.sweep_rows::<EntriesRow>(a.cutoff_ms, a.max_rows - removed)?;
    }
    if removed < a.max_rows {
        let cutoff = a.cutoff_ms.saturating_sub(usage_kept_ms(store)?);
        removed += store.sweep_usage(cutoff, a.max_rows - removed)?;
    }
    Ok(removed)
}

pub(super) fn writable_everywhere<S: Store>(store: &mut S) -> Result<()> {
    for rows in [Rows::Buckets, Rows::Budgets, Rows::Entries] {
        writable(store, rows)?;
    }
    Ok(())
}

/// rl_reset: forget every bucket, budget, window and lease under a key.
pub fn reset<S: Store>(store: &mut S, key: &str) -> Result<i64> {
    writable_everywhere(store)?;
    in_one_unit(store, |store| Ok(store.delete_bucket(key)? + store.delete_key(key)?))
}

pub(super) fn damaged(kind: EntryKind) -> Error {
    Error::storage(msg::DAMAGED.render(&[&kind.as_str()]))
}

/// The entries of a window row (none without a row).
pub(super) fn window_entries(row: Option<&EntriesRow>) -> Result<Vec<window::Entry>> {
    row.map_or(Some(Vec::new()), |r| window::decode(&r.entries)).ok_or_else(|| damaged(EntryKind::Window))
}

/// The leases of a lease row (none without a row).
pub(super) fn leases_of(row: Option<&EntriesRow>) -> Result<Leases> {
    row.map_or(Some(Leases::default()), |r| Leases::decode(&r.entries)).ok_or_else(|| damaged(EntryKind::Lease))
}

/// The rows a window's entries are kept in: a sliding window's and a fixed window's apart,
/// so one key may carry both.
pub(super) fn window_kind(limits: &window::WindowLimits) -> EntryKind {
    if limits.fixed {
        EntryKind::FixedWindow
    } else {
        EntryKind::Window
    }
}

/// The row an admitted window decision stores, within the bound on entries per key.
pub(super) fn window_row(d: &WindowDecision, window_ms: i64) -> Result<Option<EntriesRow>> {
    let Some(entries) = &d.new_entries else { return Ok(None) };
    if entries.len() > window::MAX_ENTRIES {
        return Err(Error::new(ErrorKind::LimitExceeded, msg::WINDOW_TOO_FULL.render(&[&window::MAX_ENTRIES])));
    }
    Ok(Some(EntriesRow { entries: window::encode(entries), empty_at: window::empty_at(entries, window_ms) }))
}

pub(super) fn lease_row(leases: Leases) -> EntriesRow {
    EntriesRow { entries: leases.encode(), empty_at: leases.empty_at() }
}

/// The one path of every change to a row of entries: decide on the row as it stands and,
/// if that writes, decide again on the row held in one unit and write that. `decide` is
/// pure and gives the answer and the row to write (None: nothing).
pub(super) fn change_entries<S: Store, R>(
    store: &mut S,
    kind: EntryKind,
    key: &str,
    decide: impl Fn(Option<&EntriesRow>) -> Result<(R, Option<EntriesRow>)>,
) -> Result<R> {
    writable(store, Rows::Entries)?;
    let at = EntriesAt { kind, key };
    let seen = store.read_row(at)?;
    let (answer, new) = decide(seen.as_ref())?;
    if new.is_none() {
        return Ok(answer);
    }
    in_one_unit(store, |store| {
        for _ in 0..MAX_ATTEMPTS {
            let held = hold_in_unit(store, at, || empty_row(kind), seen.is_none())?;
            let (answer, new) = decide(held.as_ref())?;
            if write_held(store, at, held.as_ref(), new.as_ref())? {
                return Ok(answer);
            }
        }
        Err(Error::storage(msg::ROW_KEPT_CHANGING.render(&[&MAX_ATTEMPTS])))
    })
}

/// The row that answers exactly as no row does: an empty list, removable by the sweep.
pub(super) fn empty_row(kind: EntryKind) -> EntriesRow {
    let entries = match kind {
        EntryKind::Window | EntryKind::FixedWindow => window::encode(&[]),
        EntryKind::Lease => Leases::default().encode(),
        EntryKind::Block => Strikes::default().encode(),
    };
    EntriesRow { entries, empty_at: 0 }
}

/// rl_window: one atomic admission to a sliding window.
pub fn window<S: Store>(store: &mut S, a: &WindowArgs) -> Result<WindowDecision> {
    change_entries(store, window_kind(&a.limits), a.key, |row| {
        let d = window::take(&window_entries(row)?, &a.limits, a.cost, a.now_ms);
        let new = window_row(&d, a.limits.window_ms)?;
        Ok((d, new))
    })
}

/// rl_window_peek: what rl_window would answer, recording nothing (read-only too).
pub fn window_peek<S: Store>(store: &mut S, a: &WindowArgs) -> Result<WindowDecision> {
    let row = store.read_row(EntriesAt { kind: window_kind(&a.limits), key: a.key })?;
    Ok(window::take(&window_entries(row.as_ref())?, &a.limits, a.cost, a.now_ms))
}

/// rl_acquire: hold one more lease if fewer than the cap are held.
pub fn acquire<S: Store>(store: &mut S, a: &AcquireArgs) -> Result<AcquireDecision> {
    change_entries(store, EntryKind::Lease, a.key, |row| {
        let mut d = lease::acquire(&leases_of(row)?, a.max_in_flight, a.lease_ms, a.now_ms);
        let new = d.new_state.take().map(lease_row);
        Ok((d, new))
    })
}

/// rl_release: give a lease back; whether it was held.
pub fn release<S: Store>(store: &mut S, a: &LeaseArgs) -> Result<bool> {
    change_entries(store, EntryKind::Lease, a.key, |row| {
        let (released, new) = lease::release(&leases_of(row)?, a.lease, a.now_ms);
        Ok((released, new.map(lease_row)))
    })
}

/// rl_renew: a held lease expires lease_seconds from now.
pub fn renew<S: Store>(store: &mut S, a: &LeaseArgs) -> Result<RenewDecision> {
    let lease_ms = a.lease_ms.expect("rl_renew parses lease_seconds");
    change_entries(store, EntryKind::Lease, a.key, |row| {
        let mut d = lease::renew(&leases_of(row)?, a.lease, lease_ms, a.now_ms);
        let new = d.new_state.take().map(lease_row);
        Ok((d, new))
    })
}

/// rl_in_flight: the leases held on a key now (read-only too).
pub fn in_flight<S: Store>(store: &mut S, key: &str, now_ms: i64) -> Result<i64> {
    let row = store.read_row(EntriesAt { kind: EntryKind::Lease, key })?;
    Ok(leases_of(row.as_ref())?.in_flight(now_ms))
}
