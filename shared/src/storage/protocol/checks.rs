//! Policies (rl_policy_set, rl_check, rl_refund_check), strikes and blocks.

use super::rows::{change_entries, damaged};
use super::take_all::{charge_limits, read_rows, refund_limits};
use super::*;
use crate::policy::ChargeCheckDecision;
use crate::policy_cache;

/// rl_policy_set: validates a whole definition, stores it in its canonical form and
/// returns that.
pub fn policy_set<S: Store>(store: &mut S, name: &str, definition: &str) -> Result<Policy> {
    let policy = Policy::parse(definition)?;
    writable(store, Rows::Policies)?;
    let revision = policy::new_revision();
    store.put_policy(name, &policy.to_json().to_text(), revision)?;
    policy_cache::forget(name);
    Ok(policy)
}

/// rl_policy_drop: whether the policy existed.
pub fn policy_drop<S: Store>(store: &mut S, name: &str) -> Result<bool> {
    writable(store, Rows::Policies)?;
    let existed = store.delete_policy(name)?;
    policy_cache::forget(name);
    Ok(existed)
}

/// rl_check: every limit of a policy on a subject, all or nothing, as rl_take_all decides
/// them. A shadow policy changes state exactly as enforcement would (charged when it would
/// admit, untouched when it would refuse) and reports the refusal it would have made.
pub fn check<'a, S: Store>(store: &mut S, a: &CheckArgs<'a>) -> Result<CheckDecision<'a>> {
    if let Some(answer) = check_one_bucket(store, a)? {
        return Ok(answer);
    }
    let (policy, keys, multiplier) = policy_for(store, a)?;
    let blocked = strikes_of(store, a.subject)?.block_at(a.now_ms);
    // A blocked subject is refused, charging nothing: every limit as it is now (cost 0).
    let cost = if blocked.is_some() { 0.0 } else { a.cost };
    let mut limits = policy.items(&keys, multiplier, cost);
    limits.sort_by(|x, y| x.row().cmp(&y.row()));
    let args = TakeAllArgs { limits, now_ms: a.now_ms };
    let decision = match blocked {
        None => take_all(store, &args)?,
        Some(_) => all_or_none::decide(read_rows(store, &args)?, a.now_ms),
    };
    let d = check_decision(a, &policy, blocked, &decision);
    let outcome = match (d.shadow, d.would_refuse()) {
        (_, false) => Outcome::Admitted,
        (true, true) => Outcome::WouldRefuse,
        (false, true) if d.blocked.is_some() => Outcome::RefusedBlocked,
        (false, true) => Outcome::Refused,
    };
    stats::sink().count(a.policy, outcome);
    if matches!(outcome, Outcome::Refused | Outcome::RefusedBlocked) {
        stats::sink().refuse(a.policy, a.subject, a.now_ms);
    }
    Ok(d)
}

/// rl_check_limits: rl_take_all of explicit limits, its outcome counted under `name` as
/// rl_check counts a policy's (admitted or refused; no shadow, no blocks), and a refused
/// `subject` noted for rl_top_refused(name).
pub fn check_limits<'i, 'a, S: Store>(
    store: &mut S,
    name: &str,
    subject: &str,
    a: &'i TakeAllArgs<'a>,
) -> Result<TakeAllDecision<'i, 'a>> {
    let decision = take_all(store, a)?;
    if decision.admitted {
        stats::sink().count(name, Outcome::Admitted);
    } else {
        stats::sink().count(name, Outcome::Refused);
        stats::sink().refuse(name, subject, a.now_ms);
    }
    Ok(decision)
}

/// A policy as stored now, parsed (or from the connection's cache when unchanged). At a
/// checks epoch this thread has not listed the blocked subjects at, it lists them too, for
/// rl_check's one-statement path.
pub(super) fn stored_policy<S: Store>(store: &mut S, name: &str) -> Result<Rc<Policy>> {
    let epoch = store.checks_epoch();
    let stored = store.read_policy(name)?;
    let Some(stored) = stored else {
        return Err(Error::unknown_policy(name));
    };
    let strike_rows = match epoch {
        Some(e) if !policy_cache::blocks_known_at(e) => store.read_strike_rows(policy_cache::KNOWN_STRIKE_ROWS + 1)?,
        _ => None,
    };
    let epoch = epoch.filter(|&e| store.checks_epoch() == Some(e));
    if let (Some(e), Some(rows)) = (epoch, strike_rows) {
        policy_cache::know_blocks(e, rows);
    }
    policy_cache::parsed(name, &stored, epoch)
}

/// A stored policy's keys for a subject and its multiplier for the tier.
fn policy_for<S: Store>(
    store: &mut S,
    a: &CheckArgs<'_>,
) -> Result<(std::rc::Rc<crate::policy::Policy>, Vec<String>, f64)> {
    let policy = stored_policy(store, a.policy)?;
    let multiplier = policy.multiplier(a.tier)?;
    let keys = policy.keys(a.policy, a.subject);
    Ok((policy, keys, multiplier))
}

/// rl_refund_check: gives `cost` back to every limit of a policy for a subject, at the
/// tier's scale (a handler failed after rl_check admitted it), as rl_refund_all gives back
/// explicit limits ([`super::take_all::refund_limits`]).
pub fn refund_check<'a, S: Store>(store: &mut S, a: &CheckArgs<'a>) -> Result<RefundCheckDecision<'a>> {
    let (policy, keys, multiplier) = policy_for(store, a)?;
    let items = refund_limits(store, &policy.items(&keys, multiplier, a.cost), a.now_ms)?;
    Ok(RefundCheckDecision { policy: a.policy, tier: a.tier, items })
}

/// rl_charge_check: charges `cost` to every limit of a policy for a subject, at the tier's
/// scale, whatever they hold (the cost of work already done), as rl_charge_all charges
/// explicit limits. A block does not stop it (the work is done); it counts in no statistic.
pub fn charge_check<'a, S: Store>(store: &mut S, a: &CheckArgs<'a>) -> Result<ChargeCheckDecision<'a>> {
    let (policy, keys, multiplier) = policy_for(store, a)?;
    let items = charge_limits(store, &policy.items(&keys, multiplier, a.cost), a.now_ms)?;
    Ok(ChargeCheckDecision { policy: a.policy, tier: a.tier, items })
}

/// rl_peek_check: what rl_check with the same arguments would answer, charging and counting
/// nothing (a cost of 0 reads what is left): read-only too, from the rows as they stand.
pub fn peek_check<'a, S: Store>(store: &mut S, a: &CheckArgs<'a>) -> Result<CheckDecision<'a>> {
    let (policy, keys, multiplier) = policy_for(store, a)?;
    let blocked = strikes_of(store, a.subject)?.block_at(a.now_ms);
    let cost = if blocked.is_some() { 0.0 } else { a.cost };
    let mut limits = policy.items(&keys, multiplier, cost);
    limits.sort_by(|x, y| x.row().cmp(&y.row()));
    let args = TakeAllArgs { limits, now_ms: a.now_ms };
    let decision = all_or_none::decide(read_rows(store, &args)?, a.now_ms);
    Ok(check_decision(a, &policy, blocked, &decision))
}

/// rl_check of a cached one-bucket policy on an unblocked subject, as rl_take is: one
/// guarded write. At the checks epoch the policy was read at, with the subject known to
/// have no recorded block, the write needs only the epoch unmoved (rl_take's own write
/// where the store keeps the epoch in memory); else its statement also finds the policy at
/// its revision and no strikes or block on the subject. None when nothing was written (a
/// refusal, a new key, a moved epoch, a changed policy, strikes, or a store that cannot):
/// the general path decides then.
pub(super) fn check_one_bucket<'a, S: Store>(store: &mut S, a: &CheckArgs<'a>) -> Result<Option<CheckDecision<'a>>> {
    let Some(cached) = policy_cache::cached(a.policy) else { return Ok(None) };
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
    let epoch = cached.epoch.filter(|&e| policy_cache::known_unblocked(e, a.subject));
    let guard =
        PolicyGuard { policy: a.policy, revision: cached.revision, subject: a.subject, now_ms: a.now_ms, epoch };
    let changed = store.change_bucket_for_policy(&keys[0], &guard, decide)?;
    let Changed { decided_on: Some(row), written: true } = changed else { return Ok(None) };
    let decision = all_or_none::decide(vec![ItemRow::Bucket(all_or_none::Read::new(item, Some(row)))], a.now_ms);
    stats::sink().count(a.policy, Outcome::Admitted);
    Ok(Some(check_decision(a, &policy, None, &decision)))
}

fn check_decision<'a>(
    a: &CheckArgs<'a>,
    policy: &Policy,
    blocked: Option<penalty::Block>,
    decision: &TakeAllDecision,
) -> CheckDecision<'a> {
    CheckDecision {
        policy: a.policy,
        tier: a.tier,
        shadow: policy.shadow,
        blocked,
        now_ms: a.now_ms,
        limits: decision.answer(),
    }
}

pub(super) fn strikes_of<S: Store>(store: &mut S, subject: &str) -> Result<Strikes> {
    let row = store.read_row(EntriesAt { kind: EntryKind::Block, key: subject })?;
    row.map_or(Some(Strikes::default()), |r| Strikes::decode(&r.entries)).ok_or_else(|| damaged(EntryKind::Block))
}

/// A change to a subject's strikes: `decide` gets the stored state and when its row stops
/// mattering, and gives the answer and the state to store with its row's `empty_at`. A
/// write that gives the subject a recorded block moves the checks epoch.
pub(super) fn change_strikes<S: Store, R>(
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
        policy_cache::forget_blocks();
    }
    Ok(answer)
}

/// rl_penalize: one strike; past the free ones, a block that doubles with each.
pub fn penalize<S: Store>(store: &mut S, a: &PenalizeArgs) -> Result<BlockAnswer> {
    let e: Escalation = a.escalation;
    change_strikes(store, a.subject, |state, _| {
        // strikes are remembered window_ms after the last
        let (answer, new) = penalty::penalize(state, &e, a.now_ms);
        (answer, Some((new, new.empty_at())))
    })
}

/// rl_block: a block for `seconds`, or until rl_unblock.
pub fn block<S: Store>(store: &mut S, a: &BlockArgs) -> Result<BlockAnswer> {
    change_strikes(store, a.subject, |state, kept_until| {
        let (answer, new) = penalty::block(state, a.length_ms, a.now_ms);
        // a row from before forgotten_at was recorded keeps the end its rl_penalize gave it
        (answer, Some((new, new.empty_at().max(kept_until))))
    })
}

/// rl_unblock: lifts a block and forgets strikes; whether a block was in force.
pub fn unblock<S: Store>(store: &mut S, subject: &str, now_ms: i64) -> Result<bool> {
    change_strikes(store, subject, |state, _| match state {
        None => (false, None),
        // the empty state's row stops mattering at once: the sweep removes it
        Some(s) => (s.block_at(now_ms).is_some(), Some((Strikes::default(), 0))),
    })
}
