//! Table-driven tests of the core rules with an explicit clock, plus a property test.

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use ratelimit_core::args::{Arg, Clock};
use ratelimit_core::bucket::{self, BucketLimits, BucketState};
use ratelimit_core::budget::{self, BudgetState, NearBudget, UsagePeriod};
use ratelimit_core::call_args::{CallArgs, SpendArgs};
use ratelimit_core::decision_slot::Decide;
use ratelimit_core::memory;
use ratelimit_core::memory_store::{MemoryStore, SharedTable};
use ratelimit_core::store::{
    BucketRows, ChangeResult, Changed, EntriesRow, EntryKind, PolicyGuard, RowAt, Rows, StoreResult, StoredPolicy,
    TableRow, TableRows, UsageOf,
};
use ratelimit_core::take_all::BucketItem;
use ratelimit_core::units::{Period, Unit, MAX_NOW_MS, MAX_WAIT_MS};
use ratelimit_core::ErrorKind;
use serde_json::{json, Value};
use std::collections::HashMap;

/// An in-memory store: the rules' view of a database, with switches for what other
/// connections can do in between: insert the same row first (`lost_races`), or sweep a
/// row between the decision and the write (`swept_mid_write`).
#[derive(Default)]
struct MapStore {
    buckets: HashMap<String, BucketState>,
    /// Table rows by key and second key part (a period's or an entries kind's name).
    budgets: HashMap<(String, String), BudgetState>,
    entries: HashMap<(String, String), EntriesRow>,
    policies: HashMap<String, StoredPolicy>,
    /// Ended budget periods kept for invoicing, by key, period and end.
    usage: std::collections::BTreeMap<(String, String, i64), UsagePeriod>,
    settings: HashMap<String, i64>,
    /// Whether rl_check may take its one-statement path (an engine's guarded UPDATE).
    checks_in_one_statement: bool,
    /// rl_checks the one-statement path answered.
    one_statement_checks: usize,
    /// The checks epoch, where the store keeps one: moved by every policy write and new block.
    checks_epoch: Option<u64>,
    read_only: bool,
    writes: usize,
    lost_races: usize,
    swept_mid_write: usize,
    atomic_depth: i32,
}

impl MapStore {
    /// The map that holds rows of kind `R`.
    fn rows<R: TableRow>(&mut self) -> &mut HashMap<(String, String), R> {
        let map: &mut dyn std::any::Any = match R::ROWS {
            Rows::Budgets => &mut self.budgets,
            _ => &mut self.entries,
        };
        map.downcast_mut().expect("one map per kind of table row")
    }

    fn address<A: RowAt>(at: A) -> (String, String) {
        (at.key().to_owned(), at.part().into_owned())
    }

    /// The engine's guarded write on one map entry.
    fn change<K: std::hash::Hash + Eq, T: Copy>(
        rows: &mut HashMap<K, T>,
        key: K,
        decide: Decide<T>,
        swept_mid_write: &mut usize,
        writes: &mut usize,
    ) -> StoreResult<Changed<T>> {
        let Some(row) = rows.get(&key).copied() else { return Ok(Changed { decided_on: None, written: false }) };
        let decided_on = Some(row);
        let Some(new) = decide(&row) else { return Ok(Changed { decided_on, written: false }) };
        if *swept_mid_write > 0 {
            *swept_mid_write -= 1;
            rows.remove(&key);
            return Ok(Changed { decided_on, written: false });
        }
        *writes += 1;
        rows.insert(key, new);
        Ok(Changed { decided_on, written: true })
    }

    /// Writes `new` where the row holds `expected` (None: where there is no row).
    fn compare_and_set<K: std::hash::Hash + Eq, T: Clone + PartialEq>(
        rows: &mut HashMap<K, T>,
        key: K,
        expected: Option<&T>,
        new: &T,
        writes: &mut usize,
    ) -> bool {
        if rows.get(&key) != expected {
            return false;
        }
        *writes += 1;
        rows.insert(key, new.clone());
        true
    }

    fn sweep<K: Clone + std::hash::Hash + Eq, T>(
        rows: &mut HashMap<K, T>,
        done: impl Fn(&T) -> bool,
        limit: i64,
    ) -> i64 {
        let doomed: Vec<K> =
            rows.iter().filter(|(_, r)| done(r)).map(|(k, _)| k.clone()).take(limit as usize).collect();
        doomed.iter().for_each(|k| {
            rows.remove(k);
        });
        doomed.len() as i64
    }
}

impl BucketRows for MapStore {
    fn buckets_read_only(&mut self) -> StoreResult<bool> {
        Ok(self.read_only)
    }
    fn read_bucket(&mut self, key: &str) -> StoreResult<Option<BucketState>> {
        Ok(self.buckets.get(key).copied())
    }
    fn insert_bucket(&mut self, key: &str, row: &BucketState) -> StoreResult<bool> {
        if self.lost_races > 0 {
            // A concurrent identical call inserts first.
            self.lost_races -= 1;
            self.writes += 1;
            self.buckets.insert(key.to_owned(), *row);
            return Ok(false);
        }
        Ok(Self::compare_and_set(&mut self.buckets, key.to_owned(), None, row, &mut self.writes))
    }
    fn change_bucket(&mut self, key: &str, decide: Decide<BucketState>) -> ChangeResult<BucketState> {
        Self::change(&mut self.buckets, key.to_owned(), decide, &mut self.swept_mid_write, &mut self.writes)
    }
    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        Ok(Self::sweep(&mut self.buckets, |b| b.full_at <= cutoff_ms, limit))
    }
    fn decide_buckets<R>(
        &mut self,
        items: &[&BucketItem],
        decide: impl FnOnce(&[Option<BucketState>]) -> (Vec<Option<BucketState>>, R),
    ) -> StoreResult<R> {
        let rows: Vec<Option<BucketState>> = items.iter().map(|i| self.buckets.get(i.key).copied()).collect();
        let (writes, answer) = decide(&rows);
        for ((item, old), new) in items.iter().zip(&rows).zip(&writes) {
            if let Some(new) = new {
                assert!(Self::compare_and_set(
                    &mut self.buckets,
                    item.key.to_owned(),
                    old.as_ref(),
                    new,
                    &mut self.writes
                ));
            }
        }
        Ok(answer)
    }
    fn change_bucket_for_policy(
        &mut self,
        key: &str,
        guard: &PolicyGuard,
        decide: Decide<BucketState>,
    ) -> ChangeResult<BucketState> {
        let holds = match self.epoch_unmoved_in_memory(guard) {
            Some(unmoved) => unmoved,
            None => {
                self.policies.get(guard.policy).is_some_and(|p| p.revision == guard.revision)
                    && self
                        .entries
                        .get(&(guard.subject.to_owned(), EntryKind::Block.as_str().to_owned()))
                        .is_none_or(|row| row.empty_at <= guard.now_ms)
            }
        };
        if !(self.checks_in_one_statement && holds) {
            return Ok(Changed { decided_on: None, written: false });
        }
        let changed = self.change_bucket(key, decide)?;
        self.one_statement_checks += changed.written as usize;
        Ok(changed)
    }
    fn delete_bucket(&mut self, key: &str) -> StoreResult<i64> {
        Ok(self.buckets.remove(key).is_some() as i64)
    }
}

impl TableRows for MapStore {
    const LOCKS_ROWS: bool = false;
    fn read_only(&mut self) -> StoreResult<bool> {
        Ok(self.read_only)
    }
    fn begin_unit(&mut self) -> StoreResult<bool> {
        self.atomic_depth += 1;
        Ok(true)
    }
    fn end_unit(&mut self, _owned: bool, _commit: bool) -> StoreResult<()> {
        self.atomic_depth -= 1;
        Ok(())
    }
    fn change_budget(&mut self, key: &str, period: Period, decide: Decide<BudgetState>) -> ChangeResult<BudgetState> {
        let at = (key.to_owned(), period.text().into_owned());
        Self::change(&mut self.budgets, at, decide, &mut self.swept_mid_write, &mut self.writes)
    }
    fn read_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>> {
        Ok(self.rows::<A::Row>().get(&Self::address(at)).cloned())
    }
    fn insert_row<A: RowAt>(&mut self, at: A, row: &A::Row) -> StoreResult<bool> {
        let mut writes = self.writes;
        let inserted = Self::compare_and_set(self.rows::<A::Row>(), Self::address(at), None, row, &mut writes);
        self.writes = writes;
        Ok(inserted)
    }
    fn hold_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>> {
        self.read_row(at)
    }
    fn replace_row<A: RowAt>(&mut self, at: A, old: &A::Row, new: &A::Row) -> StoreResult<bool> {
        let mut writes = self.writes;
        let replaced = Self::compare_and_set(self.rows::<A::Row>(), Self::address(at), Some(old), new, &mut writes);
        self.writes = writes;
        Ok(replaced)
    }
    fn sweep_rows<R: TableRow>(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        if R::ROWS == Rows::Budgets {
            // as the statement: a period with something counted goes only once it is kept
            let kept: Vec<(String, String, i64)> = self.usage.keys().cloned().collect();
            let mut doomed: Vec<(String, String)> = (self.budgets.iter())
                .filter(|((k, p), r)| {
                    r.resets_at <= cutoff_ms && (r.used == 0 || kept.contains(&(k.clone(), p.clone(), r.resets_at)))
                })
                .map(|(k, _)| k.clone())
                .collect();
            doomed.sort();
            doomed.truncate(limit as usize);
            doomed.iter().for_each(|k| {
                self.budgets.remove(k);
            });
            return Ok(doomed.len() as i64);
        }
        Ok(Self::sweep(self.rows::<R>(), |row| row.ends_at() <= cutoff_ms, limit))
    }
    fn keep_usage(&mut self, u: &UsagePeriod) -> StoreResult<()> {
        self.writes += 1;
        self.usage.entry((u.key.clone(), u.period.clone(), u.ends_at)).or_insert_with(|| u.clone());
        Ok(())
    }
    fn ended_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<Vec<(String, String, BudgetState)>> {
        let mut ended: Vec<(String, String, BudgetState)> = (self.budgets.iter())
            .filter(|(_, r)| r.resets_at <= cutoff_ms && r.used != 0)
            .map(|((k, p), r)| (k.clone(), p.to_string(), *r))
            .collect();
        ended.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        ended.truncate(limit as usize);
        Ok(ended)
    }
    fn read_usage(&mut self, of: UsageOf, from_ms: i64, to_ms: i64, limit: i64) -> StoreResult<Vec<UsagePeriod>> {
        let place = |u: &UsagePeriod| (u.ends_at, u.key.clone(), u.period.clone());
        let mut found: Vec<UsagePeriod> = self
            .usage
            .values()
            .filter(|u| u.ends_at > from_ms && u.ends_at <= to_ms)
            .filter(|u| match of {
                UsageOf::Key(key) => u.key == key,
                UsageOf::Every { after: None } => true,
                UsageOf::Every { after: Some(c) } => place(u) > (c.ends_at, c.key.clone(), c.period.clone()),
            })
            .cloned()
            .collect();
        found.sort_by_key(place);
        found.truncate(limit as usize);
        Ok(found)
    }
    fn read_setting(&mut self, name: &str) -> StoreResult<Option<i64>> {
        Ok(self.settings.get(name).copied())
    }
    fn write_setting(&mut self, name: &str, value: i64) -> StoreResult<()> {
        self.settings.insert(name.to_owned(), value);
        Ok(())
    }
    fn sweep_usage(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        let doomed: Vec<_> = self
            .usage
            .iter()
            .filter(|(_, u)| u.ends_at <= cutoff_ms)
            .map(|(k, _)| k.clone())
            .take(limit as usize)
            .collect();
        doomed.iter().for_each(|k| {
            self.usage.remove(k);
        });
        Ok(doomed.len() as i64)
    }
    fn delete_key(&mut self, key: &str) -> StoreResult<i64> {
        let count = |s: &Self| s.budgets.len() + s.entries.len();
        let before = count(self);
        self.budgets.retain(|(k, _), _| k != key);
        self.entries.retain(|(k, _), _| k != key);
        Ok((before - count(self)) as i64)
    }
    fn budgets_near(&mut self, fraction: f64, now_ms: i64, limit: i64) -> StoreResult<Vec<NearBudget>> {
        let mut near: Vec<NearBudget> = (self.budgets.iter())
            .filter(|(_, row)| budget::is_near(row, fraction, now_ms))
            .map(|((key, period), row)| NearBudget {
                key: key.clone(),
                period: period.to_string(),
                used: row.used,
                quota: row.quota,
                resets_at: row.resets_at,
            })
            .collect();
        near.sort_by(budget::near_order);
        near.truncate(limit as usize);
        Ok(near)
    }
    fn read_policy(&mut self, name: &str) -> StoreResult<Option<StoredPolicy>> {
        Ok(self.policies.get(name).cloned())
    }
    fn put_policy(&mut self, name: &str, definition: &str, revision: i64) -> StoreResult<()> {
        self.writes += 1;
        self.policies.insert(name.to_owned(), StoredPolicy { definition: definition.to_owned(), revision });
        self.checks_epoch = self.checks_epoch.map(|e| e + 1);
        Ok(())
    }
    fn delete_policy(&mut self, name: &str) -> StoreResult<bool> {
        self.checks_epoch = self.checks_epoch.map(|e| e + 1);
        Ok(self.policies.remove(name).is_some())
    }
    fn read_strike_rows(&mut self, limit: i64) -> StoreResult<Option<Vec<(String, String)>>> {
        let rows = self.entries.iter().filter(|((_, kind), _)| *kind == EntryKind::Block.as_str());
        Ok(Some(rows.take(limit as usize).map(|((subject, _), row)| (subject.clone(), row.entries.clone())).collect()))
    }
    const CHECKS_EPOCH_IN_MEMORY: bool = true;
    fn checks_epoch(&mut self) -> Option<u64> {
        self.checks_epoch
    }
    fn checks_changed(&mut self) -> StoreResult<()> {
        self.checks_epoch = self.checks_epoch.map(|e| e + 1);
        Ok(())
    }
}

/// The SQL functions as the engines reach them: through their descriptors.
mod calls {
    use super::{Arg, Clock, MapStore};
    use ratelimit_core::functions::{self as f, Function};
    use ratelimit_core::{Answer, Result};

    fn run(s: &mut MapStore, function: &Function, args: &[Arg], clock: &Clock) -> Result<Answer> {
        ratelimit_core::calls::call(function, s, args, clock)
    }

    fn text(a: Answer) -> String {
        match a {
            Answer::Json(j) => j.to_text(),
            Answer::Text(t) => t,
            other => panic!("not text: {other:?}"),
        }
    }

    fn int(a: Answer) -> i64 {
        match a {
            Answer::Int(n) => n,
            other => panic!("not an integer: {other:?}"),
        }
    }

    macro_rules! json_calls {
        ($($name:ident => $descriptor:ident;)*) => {$(
            pub fn $name(s: &mut MapStore, args: &[Arg], clock: &Clock) -> Result<String> {
                run(s, &f::$descriptor, args, clock).map(text)
            }
        )*};
    }

    json_calls! {
        rl_take => RL_TAKE;
        rl_spend => RL_SPEND;
        rl_budget => RL_BUDGET;
        rl_peek => RL_PEEK;
        rl_refund => RL_REFUND;
        rl_refund_budget => RL_REFUND_BUDGET;
        rl_take_all => RL_TAKE_ALL;
        rl_window => RL_WINDOW;
        rl_window_peek => RL_WINDOW_PEEK;
        rl_acquire => RL_ACQUIRE;
        rl_renew => RL_RENEW;
        rl_charge => RL_CHARGE;
        rl_charge_budget => RL_CHARGE_BUDGET;
        rl_policy_set => RL_POLICY_SET;
        rl_check => RL_CHECK;
        rl_refund_check => RL_REFUND_CHECK;
        rl_penalize => RL_PENALIZE;
        rl_budgets_near => RL_BUDGETS_NEAR;
        rl_usage => RL_USAGE;
    }

    pub fn rl_release(s: &mut MapStore, args: &[Arg], clock: &Clock) -> Result<bool> {
        match run(s, &f::RL_RELEASE, args, clock)? {
            Answer::Bool(b) => Ok(b),
            other => panic!("not a boolean: {other:?}"),
        }
    }

    pub fn rl_in_flight(s: &mut MapStore, args: &[Arg], clock: &Clock) -> Result<i64> {
        run(s, &f::RL_IN_FLIGHT, args, clock).map(int)
    }

    pub fn rl_sweep(s: &mut MapStore, args: &[Arg], clock: &Clock) -> Result<i64> {
        run(s, &f::RL_SWEEP, args, clock).map(int)
    }

    pub fn rl_usage_retention(s: &mut MapStore, args: &[Arg], clock: &Clock) -> Result<i64> {
        run(s, &f::RL_USAGE_RETENTION, args, clock).map(int)
    }

    pub fn rl_reset(s: &mut MapStore, args: &[Arg]) -> Result<i64> {
        run(s, &f::RL_RESET, args, &super::TEST_CLOCK).map(int)
    }
}

fn encode_key(parts: &[Arg]) -> ratelimit_core::Result<String> {
    ratelimit_core::key::encode_key(parts).map_err(|e| e.in_function("rl_key"))
}

fn headers_of(result: &str) -> ratelimit_core::Result<String> {
    ratelimit_core::headers::headers(result).map(|h| h.to_text()).map_err(|e| e.in_function("rl_headers"))
}

const TEST_CLOCK: Clock = Clock { wall_ms: 4_000_000_000_000, explicit_allowed: true };

fn parsed(text: String) -> Value {
    serde_json::from_str(&text).expect("results are JSON")
}

fn take(s: &mut MapStore, key: &str, burst: f64, rate: f64, cost: f64, now: i64) -> Value {
    parsed(
        calls::rl_take(
            s,
            &[Arg::Text(key), Arg::Real(burst), Arg::Real(rate), Arg::Real(cost), Arg::Integer(now)],
            &TEST_CLOCK,
        )
        .unwrap(),
    )
}

fn spend(s: &mut MapStore, key: &str, period: &str, quota: Arg, cost: Arg, now: i64) -> Value {
    parsed(
        calls::rl_spend(s, &[Arg::Text(key), Arg::Text(period), quota, cost, Arg::Integer(now)], &TEST_CLOCK).unwrap(),
    )
}

fn ms(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap().timestamp_millis()
}

#[test]
fn the_contract_example_burst_3_refill_60() {
    let mut s = MapStore::default();
    // (now_ms, admitted, remaining, retry_after_ms, retry_after_seconds)
    let steps = [
        (0, true, 2, 0, 0),
        (0, true, 1, 0, 0),
        (0, true, 0, 0, 0),
        (0, false, 0, 1000, 1),
        (999, false, 0, 1, 1),
        (1000, true, 0, 0, 0),
    ];
    for (now, admitted, remaining, retry_ms, retry_s) in steps {
        let r = take(&mut s, "a", 3.0, 60.0, 1.0, now);
        assert_eq!(r["admitted"], admitted, "at {now}: {r}");
        assert_eq!(r["remaining"], remaining, "at {now}: {r}");
        assert_eq!(r["retry_after_ms"], retry_ms, "at {now}: {r}");
        assert_eq!(r["retry_after_seconds"], retry_s, "at {now}: {r}");
        assert_eq!(r["limit"], 3);
    }
    assert_eq!(take(&mut s, "b", 3.0, 60.0, 1.0, 0)["remaining"], 2, "a second key has its own bucket");
    let idle = take(&mut s, "a", 3.0, 60.0, 1.0, 10_000_000);
    assert_eq!(idle["remaining"], 2, "never more than burst after idling: {idle}");
}

#[test]
fn result_keys_are_exactly_the_contract() {
    let mut s = MapStore::default();
    let r = take(&mut s, "k", 3.0, 60.0, 1.0, 0);
    let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "admitted",
            "remaining",
            "limit",
            "retry_after_ms",
            "retry_after_seconds",
            "reset_after_seconds",
            "exceeds_limit",
            "refill_seconds"
        ]
    );
    let b = spend(&mut s, "k", "day", Arg::Integer(5), Arg::Integer(1), 0);
    let keys: Vec<&str> = b.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "admitted",
            "used",
            "limit",
            "remaining",
            "resets_at",
            "retry_after_seconds",
            "reset_after_seconds",
            "exceeds_limit",
            "period_seconds"
        ]
    );
}

#[test]
fn cost_above_burst_is_refused_with_full_refill_time() {
    let mut s = MapStore::default();
    let r = take(&mut s, "k", 3.0, 60.0, 4.0, 0);
    assert_eq!(r["admitted"], false);
    assert_eq!(r["retry_after_ms"], 3000);
    assert_eq!(r["reset_after_seconds"], 0, "an untouched bucket is full");
    assert_eq!(s.writes, 0, "a refusal writes nothing");
}

#[test]
fn reset_after_counts_until_full() {
    let mut s = MapStore::default();
    // burst 10, 6/min = 1 token per 10 s; take 4 -> full again in 40 s
    let r = take(&mut s, "k", 10.0, 6.0, 4.0, 0);
    assert_eq!(r["reset_after_seconds"], 40);
    let r = take(&mut s, "k", 10.0, 6.0, 1.0, 5_500);
    assert_eq!(r["reset_after_seconds"], 45, "{r}");
}

#[test]
fn clock_behind_the_row_gets_no_refill_and_never_moves_times_back() {
    let mut s = MapStore::default();
    take(&mut s, "k", 2.0, 60.0, 2.0, 10_000);
    let stored = s.buckets["k"];
    let r = take(&mut s, "k", 2.0, 60.0, 1.0, 5_000);
    assert_eq!(r["admitted"], false);
    // waiting until the row's own time plus one token's refill
    assert_eq!(r["retry_after_ms"], 6_000);
    assert_eq!(s.buckets["k"], stored);
    let r = take(&mut s, "k", 2.0, 60.0, 1.0, 11_000);
    assert_eq!(r["admitted"], true);
    assert!(s.buckets["k"].refilled_at >= stored.refilled_at);
}

#[test]
fn lowered_burst_caps_the_stored_level() {
    let mut s = MapStore::default();
    take(&mut s, "k", 10.0, 60.0, 1.0, 0); // 9 left
    let r = take(&mut s, "k", 3.0, 60.0, 1.0, 0);
    assert_eq!(r["remaining"], 2);
    assert_eq!(r["limit"], 3);
}

#[test]
fn odd_rates_meet_the_retry_boundary_exactly() {
    for rate in [7.0, 0.5, 100_000.0, 1.0 / 3.0, 59.999, 1e-3] {
        for burst in [1.0, 3.0, 2.5, 1000.0] {
            for cost in [1.0, 0.7, 2.0] {
                if cost > burst {
                    continue;
                }
                let limits = BucketLimits { burst, refill_per_minute: rate };
                let empty = BucketState { level: 0.0, refilled_at: 12_345, full_at: 0 };
                let d = bucket::take(Some(&empty), &limits, cost, 12_345);
                assert!(!d.admitted);
                let wait = d.retry_after_ms;
                assert!(wait >= 1);
                assert!(
                    bucket::take(Some(&empty), &limits, cost, 12_345 + wait).admitted,
                    "rate {rate} burst {burst} cost {cost} wait {wait}"
                );
                assert!(
                    !bucket::take(Some(&empty), &limits, cost, 12_345 + wait - 1).admitted,
                    "rate {rate} burst {burst} cost {cost} wait {wait}"
                );
            }
        }
    }
}

#[test]
fn huge_and_tiny_numbers_stay_finite() {
    let mut s = MapStore::default();
    let r = take(&mut s, "k", 1e15, 1e-300, 1e15, 0);
    assert_eq!(r["admitted"], true);
    let r = take(&mut s, "k", 1e15, 1e-300, 1e15, 1);
    assert_eq!(r["admitted"], false);
    assert_eq!(r["retry_after_ms"], MAX_WAIT_MS);
    assert_eq!(r["refill_seconds"], MAX_WAIT_MS / 1000, "capped as every wait is");
    assert!(r["remaining"].is_i64());
    // past where token counts are exact: refused at the edge, by name, writing nothing
    for (burst, rate, cost, field) in
        [(1e308, 1.0, 1.0, "burst"), (1.0, 1e16, 1.0, "refill_per_minute"), (1e15, 1.0, 2e15, "cost")]
    {
        let args = [Arg::Text("e"), Arg::Real(burst), Arg::Real(rate), Arg::Real(cost), Arg::Integer(0)];
        let e = calls::rl_take(&mut s, &args, &TEST_CLOCK).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.to_string().starts_with(&format!("rl_take: {field} must be at most 1000000000000000")), "{e}");
    }
    assert!(!s.buckets.contains_key("e"));
}

/// rl_charge and rl_charge_budget never wrap: a debt past 1e15 tokens, or a period's use
/// past 2^53 - 1 millionths, is a range error that charges nothing.
#[test]
fn charges_past_the_exact_range_are_refused() {
    let mut s = MapStore::default();
    let charge = |s: &mut MapStore, amount: f64| {
        let args = [Arg::Text("d"), Arg::Integer(10), Arg::Integer(60), Arg::Real(amount), Arg::Integer(0)];
        calls::rl_charge(s, &args, &TEST_CLOCK)
    };
    assert!(charge(&mut s, 1e15).is_ok());
    let before = s.buckets["d"];
    let e = charge(&mut s, 1e15).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfRange);
    assert_eq!(e.to_string(), "rl_charge: the bucket's debt would pass 1000000000000000 tokens; nothing was charged");
    assert_eq!(s.buckets["d"], before, "nothing written");
    let r = take(&mut s, "d", 10.0, 60.0, 1.0, 0);
    assert_eq!(r["remaining"], json!(10 - 1_000_000_000_000_000i64), "the debt as charged, exact");
    let charge_budget = |s: &mut MapStore| {
        let args = [Arg::Text("b"), Arg::Text("day"), Arg::Integer(1_000_000_000), Arg::Integer(0)];
        calls::rl_charge_budget(s, &args, &TEST_CLOCK)
    };
    for _ in 0..9 {
        charge_budget(&mut s).unwrap();
    }
    let e = charge_budget(&mut s).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfRange);
    assert!(e.to_string().starts_with("rl_charge_budget: the period's use would pass 9007199254 units"), "{e}");
    assert_eq!(s.budgets[&("b".to_owned(), "day".to_owned())].used, 9_000_000_000_000_000);
}

/// Amounts are exact millionths: one below a millionth is refused as documented, never
/// rounded up to one.
#[test]
fn amounts_below_a_millionth_are_refused() {
    let mut s = MapStore::default();
    for cost in [Arg::Real(0.0000005), Arg::Text("0.0000005"), Arg::Real(1e-300)] {
        let args = [Arg::Text("k"), Arg::Text("day"), Arg::Integer(1), cost, Arg::Integer(0)];
        let e = calls::rl_spend(&mut s, &args, &TEST_CLOCK).unwrap_err();
        assert!(e.to_string().starts_with("rl_spend: cost must be at least 0.000001, got"), "{e}");
        let args = [Arg::Text("w"), Arg::Integer(1), Arg::Integer(60), cost, Arg::Integer(0)];
        let e = calls::rl_window(&mut s, &args, &TEST_CLOCK).unwrap_err();
        assert!(e.to_string().starts_with("rl_window: cost must be at least 0.000001, got"), "{e}");
    }
    assert!(s.budgets.is_empty() && s.entries.is_empty());
    let args = [Arg::Text("k"), Arg::Text("day"), Arg::Integer(1), Arg::Real(0.000001), Arg::Integer(0)];
    assert!(calls::rl_spend(&mut s, &args, &TEST_CLOCK).is_ok(), "0.000001 itself is the least amount");
}

#[test]
fn calendar_periods_in_utc() {
    // (period, now, expected end)
    let cases = [
        (Period::plain(Unit::Day), ms(2026, 11, 29, 13, 5, 0), ms(2026, 11, 30, 0, 0, 0)),
        (Period::plain(Unit::Day), ms(2026, 12, 31, 23, 59, 59), ms(2027, 1, 1, 0, 0, 0)),
        (Period::plain(Unit::Day), ms(2028, 2, 28, 12, 0, 0), ms(2028, 2, 29, 0, 0, 0)),
        (Period::plain(Unit::Day), ms(2028, 2, 29, 0, 0, 0), ms(2028, 3, 1, 0, 0, 0)),
        (Period::plain(Unit::Month), ms(2028, 2, 10, 0, 0, 0), ms(2028, 3, 1, 0, 0, 0)),
        (Period::plain(Unit::Month), ms(2027, 2, 28, 23, 0, 0), ms(2027, 3, 1, 0, 0, 0)),
        (Period::plain(Unit::Month), ms(2026, 12, 31, 23, 59, 59), ms(2027, 1, 1, 0, 0, 0)),
        (Period::plain(Unit::Month), ms(2026, 4, 30, 10, 0, 0), ms(2026, 5, 1, 0, 0, 0)),
        (Period::plain(Unit::Month), ms(2026, 5, 1, 0, 0, 0), ms(2026, 6, 1, 0, 0, 0)),
        (Period::plain(Unit::Month), 0, ms(1970, 2, 1, 0, 0, 0)),
        (Period::plain(Unit::Hour), ms(2026, 12, 31, 23, 59, 59), ms(2027, 1, 1, 0, 0, 0)),
        (Period::plain(Unit::Hour), ms(2026, 3, 29, 1, 0, 0), ms(2026, 3, 29, 2, 0, 0)),
        (Period::plain(Unit::Hour), 0, ms(1970, 1, 1, 1, 0, 0)),
        // ISO weeks start on Monday: 1970-01-01 was a Thursday, 2026-12-06 a Sunday
        (Period::plain(Unit::Week), 0, ms(1970, 1, 5, 0, 0, 0)),
        (Period::plain(Unit::Week), ms(2026, 12, 6, 23, 59, 59), ms(2026, 12, 7, 0, 0, 0)),
        (Period::plain(Unit::Week), ms(2026, 12, 7, 0, 0, 0), ms(2026, 12, 14, 0, 0, 0)),
        (Period::plain(Unit::Week), ms(2026, 12, 30, 12, 0, 0), ms(2027, 1, 4, 0, 0, 0)),
        (Period::plain(Unit::Year), ms(2028, 2, 29, 0, 0, 0), ms(2029, 1, 1, 0, 0, 0)),
        (Period::plain(Unit::Year), ms(2026, 12, 31, 23, 59, 59), ms(2027, 1, 1, 0, 0, 0)),
        (Period::plain(Unit::Year), ms(2027, 1, 1, 0, 0, 0), ms(2028, 1, 1, 0, 0, 0)),
        (Period::plain(Unit::Year), 0, ms(1971, 1, 1, 0, 0, 0)),
    ];
    for (period, now, end) in cases {
        assert_eq!(period.end_ms(now), end, "{period:?} at {now}");
    }
}

#[test]
fn every_period_tiles_time_from_1970_to_9999() {
    for period in Unit::ALL.map(Period::plain) {
        // about 11 months and a prime number of hours
        assert_tiles(period, 7_919 * 3_600_000 + 12_345, ratelimit_core::units::MAX_NOW_MS);
    }
}

/// Each instant from 1970 to `until`, in steps of `step` ms, lies in exactly one period, and
/// periods follow each other.
fn assert_tiles(period: Period, step: i64, until: i64) {
    let mut now = 0i64;
    while now < until {
        let (start, end) = period.bounds(now);
        assert!(start <= now && now < end, "{period:?} at {now}: {start}..{end}");
        assert_eq!(period.start_ms(end), end, "{period:?}: the next period starts where this one ends");
        assert_eq!(period.end_ms(end - 1), end, "{period:?} at {now}");
        now += step;
    }
}

#[test]
fn anchored_and_zoned_periods() {
    // (period, now, expected start, expected end), all times UTC
    let cases = [
        // a month from the 31st at 09:00 runs to the last day of a shorter month, then back
        ("month from 31 09:00", ms(2027, 2, 10, 0, 0, 0), ms(2027, 1, 31, 9, 0, 0), ms(2027, 2, 28, 9, 0, 0)),
        ("month from 31 09:00", ms(2027, 3, 1, 0, 0, 0), ms(2027, 2, 28, 9, 0, 0), ms(2027, 3, 31, 9, 0, 0)),
        ("month from 31 09:00", ms(2028, 2, 15, 0, 0, 0), ms(2028, 1, 31, 9, 0, 0), ms(2028, 2, 29, 9, 0, 0)),
        ("month from 31 09:00", ms(2027, 1, 31, 8, 59, 59), ms(2026, 12, 31, 9, 0, 0), ms(2027, 1, 31, 9, 0, 0)),
        // a year from the 29th of February starts on the 28th in other years
        ("year from 02-29", ms(2027, 6, 1, 0, 0, 0), ms(2027, 2, 28, 0, 0, 0), ms(2028, 2, 29, 0, 0, 0)),
        ("year from 02-29", ms(2028, 2, 28, 12, 0, 0), ms(2027, 2, 28, 0, 0, 0), ms(2028, 2, 29, 0, 0, 0)),
        // a week from Wednesday at noon; 2026-12-06 is a Sunday
        ("week from wed 12:00", ms(2026, 12, 6, 10, 0, 0), ms(2026, 12, 2, 12, 0, 0), ms(2026, 12, 9, 12, 0, 0)),
        ("week from wed 12:00", ms(2026, 12, 9, 12, 0, 0), ms(2026, 12, 9, 12, 0, 0), ms(2026, 12, 16, 12, 0, 0)),
        ("day from 06:00", ms(2026, 12, 6, 5, 59, 59), ms(2026, 12, 5, 6, 0, 0), ms(2026, 12, 6, 6, 0, 0)),
        ("hour from :30", ms(2026, 12, 6, 10, 15, 0), ms(2026, 12, 6, 9, 30, 0), ms(2026, 12, 6, 10, 30, 0)),
        // a local day of 23 hours (2026-03-08, New York springs forward) and of 25 (2026-11-01)
        ("day in America/New_York", ms(2026, 3, 8, 12, 0, 0), ms(2026, 3, 8, 5, 0, 0), ms(2026, 3, 9, 4, 0, 0)),
        ("day in America/New_York", ms(2026, 11, 1, 12, 0, 0), ms(2026, 11, 1, 4, 0, 0), ms(2026, 11, 2, 5, 0, 0)),
        // 02:30 is skipped on 2026-03-08: read with the offset before the change, 03:30 EDT
        (
            "day from 02:30 in America/New_York",
            ms(2026, 3, 8, 7, 0, 0),
            ms(2026, 3, 7, 7, 30, 0),
            ms(2026, 3, 8, 7, 30, 0),
        ),
        (
            "day from 02:30 in America/New_York",
            ms(2026, 3, 8, 7, 30, 0),
            ms(2026, 3, 8, 7, 30, 0),
            ms(2026, 3, 9, 6, 30, 0),
        ),
        // 01:30 happens twice on 2026-11-01: the later one, 01:30 EST
        (
            "day from 01:30 in America/New_York",
            ms(2026, 11, 1, 6, 0, 0),
            ms(2026, 10, 31, 5, 30, 0),
            ms(2026, 11, 1, 6, 30, 0),
        ),
        // a month and a week that contain a change (Paris, 2026-03-29)
        ("month in Europe/Paris", ms(2026, 3, 15, 0, 0, 0), ms(2026, 2, 28, 23, 0, 0), ms(2026, 3, 31, 22, 0, 0)),
        ("week in Europe/Paris", ms(2026, 3, 25, 0, 0, 0), ms(2026, 3, 22, 23, 0, 0), ms(2026, 3, 29, 22, 0, 0)),
        // a half-hour zone: local hours from :30 are UTC's whole hours
        (
            "hour from :30 in Asia/Kolkata",
            ms(2026, 12, 6, 10, 15, 0),
            ms(2026, 12, 6, 10, 0, 0),
            ms(2026, 12, 6, 11, 0, 0),
        ),
        // Samoa skipped 2011-12-30 whole: the 29th ends where the 31st starts
        ("day in Pacific/Apia", ms(2011, 12, 30, 9, 59, 0), ms(2011, 12, 29, 10, 0, 0), ms(2011, 12, 30, 10, 0, 0)),
        ("day in Pacific/Apia", ms(2011, 12, 30, 10, 0, 0), ms(2011, 12, 30, 10, 0, 0), ms(2011, 12, 31, 10, 0, 0)),
        // far ahead, the zone's rule still moves the clocks (2150-07-01 is in summer time)
        ("day in America/New_York", ms(2150, 7, 1, 12, 0, 0), ms(2150, 7, 1, 4, 0, 0), ms(2150, 7, 2, 4, 0, 0)),
        // the last instant accepted is already 10000-01-01 in Paris; a period may end in year 10000
        ("year from 02-29 in Europe/Paris", MAX_NOW_MS, ms(9999, 2, 27, 23, 0, 0), 253_407_394_800_000),
        ("day in Pacific/Kiritimati", MAX_NOW_MS, ms(9999, 12, 31, 10, 0, 0), 253_402_336_800_000),
    ];
    for (text, now, start, end) in cases {
        let p = Period::parse(text).unwrap();
        assert_eq!(p.bounds(now), (start, end), "{text} at {now}");
    }
}

#[test]
fn anchored_and_zoned_periods_tile_time() {
    let forms = [
        "month from 31 09:00 in America/New_York",
        "day from 02:30 in America/New_York",
        "day from 01:30 in Europe/London",
        "week from sun 02:00 in Australia/Sydney",
        "hour from :45 in Australia/Lord_Howe",
        "year from 02-29 02:30 in America/Santiago",
        "month from 15 in Pacific/Chatham",
        "day in Pacific/Apia",
    ];
    for text in forms {
        // about 25 days and a prime number of hours
        assert_tiles(Period::parse(text).unwrap(), 613 * 3_600_000 + 12_345, ms(2101, 1, 1, 0, 0, 0));
    }
}

#[test]
fn a_budget_counts_periods_of_different_forms_apart() {
    let mut s = MapStore::default();
    let now = ms(2026, 12, 6, 12, 0, 0);
    for period in ["month", "month from 6", "month in Europe/Paris", "month from 6 in Europe/Paris"] {
        let r = spend(&mut s, "k", period, Arg::Integer(1), Arg::Integer(1), now);
        assert_eq!(r["admitted"], true, "{period}: {r}");
    }
    let r = spend(&mut s, "k", "month from 06 00:00 in europe/PARIS", Arg::Integer(1), Arg::Integer(1), now);
    assert_eq!(r["admitted"], false, "the same period as 'month from 6 in Europe/Paris': {r}");
    assert_eq!(r["resets_at"], ms(2027, 1, 5, 23, 0, 0) / 1000);
    assert_eq!(r["period_seconds"], 31 * 86_400);
}

#[test]
fn a_spend_one_ms_before_midnight_belongs_to_that_day() {
    let mut s = MapStore::default();
    let midnight = ms(2026, 12, 1, 0, 0, 0);
    let r = spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(1), midnight - 1);
    assert_eq!(r["admitted"], true);
    assert_eq!(r["resets_at"], midnight / 1000);
    let r = spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(1), midnight - 1);
    assert_eq!(r["admitted"], false);
    assert_eq!(r["retry_after_seconds"], 1, "never 0 on a refusal");
    let r = spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(1), midnight);
    assert_eq!(r["admitted"], true, "a new day: {r}");
    assert_eq!(r["used"], 1);
}

#[test]
fn tenths_are_exact() {
    let mut s = MapStore::default();
    for i in 1..=10 {
        let r = spend(&mut s, "k", "month", Arg::Integer(1), Arg::Real(0.1), 0);
        assert_eq!(r["admitted"], true, "spend {i}");
    }
    let r = calls::rl_budget(
        &mut s,
        &[Arg::Text("k"), Arg::Text("month"), Arg::Integer(1), Arg::Real(0.1), Arg::Integer(0)],
        &TEST_CLOCK,
    )
    .unwrap();
    assert_eq!(
        r,
        r#"{"admitted":false,"used":1,"limit":1,"remaining":0,"resets_at":2678400,"retry_after_seconds":2678400,"reset_after_seconds":2678400,"exceeds_limit":false,"period_seconds":2678400}"#
    );
    let r = spend(&mut s, "k", "month", Arg::Integer(1), Arg::Real(0.1), 0);
    assert_eq!(r["admitted"], false);
    assert_eq!(r["used"].to_string(), "1");
    // text decimals are exact too
    let r = spend(&mut s, "t", "day", Arg::Text("0.3"), Arg::Text("0.1"), 0);
    assert_eq!(r["remaining"].to_string(), "0.2");
}

#[test]
fn budget_and_bucket_and_periods_are_separate() {
    let mut s = MapStore::default();
    take(&mut s, "k", 1.0, 1.0, 1.0, 0);
    assert_eq!(spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(1), 0)["admitted"], true);
    assert_eq!(spend(&mut s, "k", "month", Arg::Integer(1), Arg::Integer(1), 0)["admitted"], true);
    assert_eq!(spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(1), 0)["admitted"], false);
    // used belongs to (key, period) whatever quota is passed
    let r = spend(&mut s, "k", "day", Arg::Integer(5), Arg::Integer(1), 0);
    assert_eq!(r["used"], 2);
    assert_eq!(r["limit"], 5);
}

#[test]
fn a_lowered_quota_keeps_the_count_and_budgets_near_shows_the_new_share() {
    let mut s = MapStore::default();
    let near = |s: &mut MapStore| {
        parsed(calls::rl_budgets_near(s, &[Arg::Real(0.9), Arg::Integer(10), Arg::Integer(1000)], &TEST_CLOCK).unwrap())
    };
    spend(&mut s, "q", "month", Arg::Integer(10), Arg::Integer(8), 0);
    assert_eq!(near(&mut s)["budgets"], serde_json::json!([]), "8 of 10");
    let r = spend(&mut s, "q", "month", Arg::Integer(5), Arg::Integer(1), 500);
    assert_eq!(
        (r["admitted"].clone(), r["used"].clone(), r["remaining"].clone()),
        (false.into(), 8.into(), (-3).into())
    );
    assert_eq!(
        near(&mut s)["budgets"],
        serde_json::json!([{"key": "q", "period": "month", "used": 8, "quota": 5, "resets_at": 2_678_400}]),
        "the refusal recorded the quota it was asked with"
    );
    let writes = s.writes;
    spend(&mut s, "q", "month", Arg::Integer(5), Arg::Integer(1), 600);
    assert_eq!(s.writes, writes, "a refusal with the same quota writes nothing");
    let r = spend(&mut s, "q", "month", Arg::Integer(20), Arg::Integer(1), 700);
    assert_eq!((r["admitted"].clone(), r["used"].clone()), (true.into(), 9.into()));
    assert_eq!(near(&mut s)["budgets"], serde_json::json!([]), "9 of 20");
}

#[test]
fn budgets_near_lists_the_current_periods_past_a_share_of_their_quota() {
    let mut s = MapStore::default();
    let near = |s: &mut MapStore, fraction: Arg, now: i64| {
        parsed(calls::rl_budgets_near(s, &[fraction, Arg::Integer(100), Arg::Integer(now)], &TEST_CLOCK).unwrap())
    };
    spend(&mut s, "a", "day", Arg::Integer(10), Arg::Integer(9), 0); // 0.9
    spend(&mut s, "b", "day", Arg::Integer(10), Arg::Integer(8), 0); // 0.8
    spend(&mut s, "b", "month", Arg::Integer(100), Arg::Integer(1), 0); // 0.01
    spend(&mut s, "c", "day", Arg::Integer(4), Arg::Integer(3), 0); // 0.75
                                                                    // a charge past the quota keeps the quota the spend gave, and lists first
    spend(&mut s, "d", "day", Arg::Integer(2), Arg::Integer(1), 0);
    calls::rl_charge_budget(&mut s, &[Arg::Text("d"), Arg::Text("day"), Arg::Integer(3), Arg::Integer(0)], &TEST_CLOCK)
        .unwrap();
    // a refund keeps it too
    spend(&mut s, "e", "day", Arg::Integer(10), Arg::Integer(10), 0);
    calls::rl_refund_budget(&mut s, &[Arg::Text("e"), Arg::Text("day"), Arg::Integer(5), Arg::Integer(0)], &TEST_CLOCK)
        .unwrap();
    // charged only: no quota is known, so it is never listed
    calls::rl_charge_budget(&mut s, &[Arg::Text("f"), Arg::Text("day"), Arg::Integer(7), Arg::Integer(0)], &TEST_CLOCK)
        .unwrap();
    let r = near(&mut s, Arg::Real(0.8), 1000);
    let listed: Vec<(String, String)> = r["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["key"].as_str().unwrap().to_owned(), b["period"].as_str().unwrap().to_owned()))
        .collect();
    let expected = [("d", "day"), ("a", "day"), ("b", "day")].map(|(k, p)| (k.to_owned(), p.to_owned()));
    assert_eq!(listed, expected);
    assert_eq!(r["fraction"], 0.8);
    assert_eq!(
        r["budgets"][0],
        serde_json::json!({"key": "d", "period": "day", "used": 4, "quota": 2, "resets_at": 86_400})
    );
    let all = near(&mut s, Arg::Integer(0), 1000);
    assert_eq!(all["budgets"].as_array().unwrap().len(), 6, "every budget with a quota: {all}");
    assert_eq!(all["budgets"][5]["key"], "b", "0.01 last");
    // n bounds the list; a period that ended lists nothing
    let two =
        calls::rl_budgets_near(&mut s, &[Arg::Integer(0), Arg::Integer(2), Arg::Integer(0)], &TEST_CLOCK).unwrap();
    assert_eq!(parsed(two)["budgets"].as_array().unwrap().len(), 2);
    let later = near(&mut s, Arg::Integer(0), 86_400_000);
    assert_eq!(later["budgets"].as_array().unwrap().len(), 1, "the month's budget alone: {later}");
    // a spend after the charge-only row gives it a quota
    spend(&mut s, "f", "day", Arg::Integer(8), Arg::Integer(1), 0);
    assert_eq!(near(&mut s, Arg::Real(1.0), 0)["budgets"][0]["key"], "d");
    assert_eq!(near(&mut s, Arg::Real(1.0), 0)["budgets"][1]["key"], "f");
    // a share that is exactly the fraction given is at it: 20 of 100 at 0.2, 0.3 of 1 at 0.3
    spend(&mut s, "h", "month", Arg::Integer(100), Arg::Integer(20), 0);
    spend(&mut s, "i", "month", Arg::Integer(1), Arg::Text("0.3"), 0);
    let at = |s: &mut MapStore, f: f64| near(s, Arg::Real(f), 0)["budgets"].as_array().unwrap().len();
    let just_past = |f: f64| f64::from_bits(f.to_bits() + 1);
    assert_eq!(at(&mut s, 0.2) - at(&mut s, just_past(0.2)), 1, "h is at 0.2");
    assert_eq!(at(&mut s, 0.3) - at(&mut s, just_past(0.3)), 1, "i is at 0.3");
    for (fraction, n, message) in [
        (Arg::Real(-0.1), Arg::Integer(1), "fraction must be a number from 0 to 1000000, got -0.1"),
        (Arg::Null, Arg::Integer(1), "fraction must be a number from 0 to 1000000, got NULL"),
        (Arg::Real(0.5), Arg::Integer(0), "n must be an integer from 1 to 10000, got 0"),
        (Arg::Real(0.5), Arg::Integer(10_001), "n must be an integer from 1 to 10000, got 10001"),
    ] {
        let e = calls::rl_budgets_near(&mut s, &[fraction, n], &TEST_CLOCK).unwrap_err();
        assert_eq!(e.to_string(), format!("rl_budgets_near: {message}"));
    }
}

#[test]
fn budget_clock_behind_a_newer_period_answers_from_that_period() {
    let state = BudgetState { used: 3_000_000, resets_at: ms(2027, 1, 1, 0, 0, 0), quota: 0 };
    let d = budget::spend(Some(&state), Period::plain(Unit::Month), 3_000_000, 1_000_000, ms(2026, 11, 15, 0, 0, 0));
    assert!(!d.admitted);
    assert_eq!(d.resets_at_ms, state.resets_at);
}

#[test]
fn sweep_removes_only_rows_that_no_longer_matter() {
    let mut s = MapStore::default();
    take(&mut s, "full-soon", 3.0, 60.0, 1.0, 0); // full at 1000
    take(&mut s, "refilling", 3.0, 60.0, 3.0, 0); // full at 3000
    spend(&mut s, "b", "day", Arg::Integer(1), Arg::Integer(1), 0); // ends at 86_400_000
    let sweep = |s: &mut MapStore, now: i64| calls::rl_sweep(s, &[Arg::Integer(now)], &TEST_CLOCK).unwrap();
    assert_eq!(sweep(&mut s, 999), 0);
    assert_eq!(sweep(&mut s, 1000), 1);
    // an answer after the sweep equals the answer had the row stayed
    assert_eq!(take(&mut s, "full-soon", 3.0, 60.0, 1.0, 1500)["remaining"], 2);
    assert_eq!(sweep(&mut s, 2499), 0, "the new full-soon row is full at 2500, refilling at 3000");
    assert_eq!(sweep(&mut s, 2500), 1);
    assert_eq!(sweep(&mut s, 86_399_999), 1, "refilling is full by now; the budget's day has not ended");
    assert_eq!(sweep(&mut s, 86_400_000), 1);
    // max_rows bounds a call: buckets first, then budgets
    for i in 0..5 {
        take(&mut s, &format!("batch{i}"), 1.0, 60.0, 1.0, 0);
    }
    spend(&mut s, "batch", "day", Arg::Integer(1), Arg::Integer(1), 0);
    let batch =
        |s: &mut MapStore| calls::rl_sweep(s, &[Arg::Integer(86_400_000), Arg::Integer(2)], &TEST_CLOCK).unwrap();
    assert_eq!([batch(&mut s), batch(&mut s), batch(&mut s), batch(&mut s)], [2, 2, 2, 0]);
    assert!(s.buckets.is_empty() && s.budgets.is_empty());
    // a caller's clock later than the real clock is held back to the real clock
    take(&mut s, "future", 3.0, 60.0, 3.0, TEST_CLOCK.wall_ms + 10);
    // (what goes: the two days of 1970 kept for invoicing, 400 days past their end)
    assert_eq!(sweep(&mut s, TEST_CLOCK.wall_ms + 1_000_000), 2);
    assert!(s.buckets.contains_key("future") && s.usage.is_empty());
}

/// A budget's ended period is kept for invoicing: when a later spend starts the next period
/// (the take_all path and the single-row path alike) and when rl_sweep removes the row;
/// rl_usage answers it by its end; rl_sweep forgets it 400 days after it ended.
#[test]
fn ended_periods_are_kept_for_invoicing_and_swept_after_400_days() {
    let mut s = MapStore::default();
    let day = 86_400_000;
    let usage = |s: &mut MapStore, key: &str, from: i64, to: i64| {
        parsed(calls::rl_usage(s, &[Arg::Text(key), Arg::Integer(from), Arg::Integer(to)], &TEST_CLOCK).unwrap())
    };
    spend(&mut s, "acme", "day", Arg::Integer(10), Arg::Real(2.5), 0);
    spend(&mut s, "acme", "day", Arg::Integer(10), Arg::Real(0.000001), 5);
    spend(&mut s, "acme", "month", Arg::Integer(100), Arg::Integer(3), 0);
    assert_eq!(usage(&mut s, "acme", 0, 100 * day)["periods"], json!([]), "nothing has ended yet");
    // the next day's first spend keeps the first day, as it stood
    spend(&mut s, "acme", "day", Arg::Integer(12), Arg::Integer(1), day + 7);
    let taken = r#"[{"key": "acme", "period": "day", "quota": 12, "cost": 4}]"#;
    let r = calls::rl_take_all(&mut s, &[Arg::Text(taken), Arg::Integer(2 * day)], &TEST_CLOCK).unwrap();
    assert_eq!(parsed(r)["admitted"], true);
    assert_eq!(
        usage(&mut s, "acme", 0, 2 * day),
        json!({"key": "acme", "from_ms": 0, "to_ms": 2 * day, "periods": [
            {"period": "day", "starts_at": 0, "ends_at": 86_400, "used": 2.500001, "quota": 10},
            {"period": "day", "starts_at": 86_400, "ends_at": 172_800, "used": 1, "quota": 12}]})
    );
    // the range is by end: after from_ms, by to_ms
    assert_eq!(usage(&mut s, "acme", day, 2 * day)["periods"].as_array().unwrap().len(), 1);
    assert_eq!(usage(&mut s, "acme", day, 2 * day - 1)["periods"], json!([]));
    // rl_sweep keeps an ended row before it removes it; a period with nothing counted is not kept
    spend(&mut s, "idle", "day", Arg::Integer(1), Arg::Integer(1), 0);
    calls::rl_refund_budget(
        &mut s,
        &[Arg::Text("idle"), Arg::Text("day"), Arg::Integer(1), Arg::Integer(0)],
        &TEST_CLOCK,
    )
    .unwrap();
    let sweep = |s: &mut MapStore, now: i64| calls::rl_sweep(s, &[Arg::Integer(now)], &TEST_CLOCK).unwrap();
    assert_eq!(sweep(&mut s, 40 * day), 3, "acme's third day, its month, idle's day");
    assert_eq!(usage(&mut s, "idle", 0, 40 * day)["periods"], json!([]));
    let kept = usage(&mut s, "acme", 0, 40 * day);
    let ends: Vec<_> =
        kept["periods"].as_array().unwrap().iter().map(|p| (p["period"].clone(), p["ends_at"].clone())).collect();
    assert_eq!(
        ends,
        [
            (json!("day"), json!(86_400)),
            (json!("day"), json!(172_800)),
            (json!("day"), json!(259_200)),
            (json!("month"), json!(2_678_400))
        ]
    );
    // kept 400 days after each ended, then swept
    assert_eq!(sweep(&mut s, 86_400_000 + 400 * day - 1), 0);
    assert_eq!(sweep(&mut s, 86_400_000 + 400 * day), 1);
    // a retention set shorter sweeps the rest sooner; a longer one keeps them longer
    let retention = |s: &mut MapStore, days: Arg| calls::rl_usage_retention(s, &[days], &TEST_CLOCK);
    assert_eq!(retention(&mut s, Arg::Null).unwrap(), 400);
    assert_eq!(retention(&mut s, Arg::Integer(800)).unwrap(), 800);
    sweep(&mut s, 2_678_400_000 + 400 * day);
    assert_eq!(s.usage.len(), 3, "800 days now");
    assert_eq!(retention(&mut s, Arg::Integer(1)).unwrap(), 1);
    assert_eq!(retention(&mut s, Arg::Null).unwrap(), 1);
    assert_eq!(sweep(&mut s, 2_678_400_000 + day), 3);
    for bad in [Arg::Integer(0), Arg::Integer(36_501), Arg::Real(1.5), Arg::Text("x")] {
        let e = retention(&mut s, bad).unwrap_err();
        assert!(e.to_string().starts_with("rl_usage_retention: days must be an integer from 1 to 36500, got"), "{e}");
    }
    assert!(s.usage.is_empty());
    // errors name the argument
    let e = calls::rl_usage(&mut s, &[Arg::Text("acme"), Arg::Integer(5), Arg::Integer(4)], &TEST_CLOCK).unwrap_err();
    assert_eq!(e.message, "to_ms must not be before from_ms, got from_ms 5 and to_ms 4");
    let e = calls::rl_usage(&mut s, &[Arg::Text("acme"), Arg::Null, Arg::Integer(4)], &TEST_CLOCK).unwrap_err();
    assert_eq!(
        e.message,
        "from_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got NULL"
    );
}

#[test]
fn a_lost_insert_race_decides_again_on_the_winners_row() {
    let mut s = MapStore { lost_races: 1, ..Default::default() };
    let r = take(&mut s, "k", 3.0, 1.0, 1.0, 0);
    assert_eq!((r["admitted"].as_bool(), r["remaining"].as_i64()), (Some(true), Some(1)));
    assert_eq!(s.writes, 2, "the winner's insert, then this call's update");
    let mut s = MapStore { lost_races: 1, ..Default::default() };
    let r = take(&mut s, "k", 1.0, 1.0, 1.0, 0);
    assert_eq!(r["admitted"], false, "the winner took the only token");
    assert_eq!(s.writes, 1);
}

#[test]
fn a_row_swept_between_decision_and_write_is_decided_again() {
    let mut s = MapStore { swept_mid_write: 1, ..Default::default() };
    s.buckets.insert("k".into(), BucketState { level: 0.0, refilled_at: 0, full_at: 60_000 });
    s.budgets.insert(("k".into(), "day".into()), BudgetState { used: 1, resets_at: 86_400_000, quota: 0 });
    let r = take(&mut s, "k", 2.0, 1.0, 1.0, 120_000);
    assert_eq!((r["admitted"].as_bool(), r["remaining"].as_i64()), (Some(true), Some(1)));
    assert_eq!(s.buckets["k"].level, 1.0, "inserted afresh after the sweep");
    s.swept_mid_write = 1;
    let r = spend(&mut s, "k", "day", Arg::Integer(5), Arg::Integer(2), 1000);
    assert_eq!((r["admitted"].as_bool(), r["used"].as_f64()), (Some(true), Some(2.0)));
    assert_eq!(s.writes, 2);
}

#[test]
fn a_refusal_writes_nothing() {
    let mut s = MapStore::default();
    assert_eq!(take(&mut s, "k", 1.0, 1.0, 1.0, 0)["admitted"], true);
    assert_eq!(take(&mut s, "k", 1.0, 1.0, 1.0, 0)["admitted"], false);
    assert_eq!(take(&mut s, "new", 1.0, 1.0, 2.0, 0)["admitted"], false);
    assert_eq!(spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(2), 0)["admitted"], false);
    assert_eq!(s.writes, 1);
    assert!(!s.buckets.contains_key("new") && s.budgets.is_empty());
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let mut s = MapStore::default();
    let cases: Vec<(&str, Vec<Arg>, &str)> = vec![
        ("rl_take", vec![Arg::Null, Arg::Integer(3), Arg::Integer(60)], "rl_take: key must be text, got NULL"),
        ("rl_take", vec![Arg::Text(""), Arg::Integer(3), Arg::Integer(60)], "rl_take: key must not be empty"),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(0), Arg::Integer(60)],
            "rl_take: burst must be a finite number greater than 0, got 0",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Text("abc"), Arg::Integer(60)],
            "rl_take: burst must be a finite number greater than 0, got 'abc'",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(3), Arg::Real(f64::NAN)],
            "rl_take: refill_per_minute must be a finite number greater than 0, got NaN",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(3), Arg::Real(f64::INFINITY)],
            "rl_take: refill_per_minute must be a finite number greater than 0, got Infinity",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Integer(-1)],
            "rl_take: cost must be a finite number greater than 0, got -1",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Null],
            "rl_take: cost must be a finite number greater than 0, got NULL",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Integer(1), Arg::Integer(-5)],
            "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got -5",
        ),
        (
            "rl_take",
            vec![Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Integer(1), Arg::Real(1.5)],
            "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 1.5",
        ),
        ("rl_take", vec![Arg::Text("k"), Arg::Integer(3)], "rl_take: expected 3 to 5 arguments, got 2"),
        (
            "rl_spend",
            vec![Arg::Text("k"), Arg::Text("fortnight"), Arg::Integer(3)],
            "rl_spend: period must be 'hour', 'day', 'week', 'month' or 'year', got 'fortnight'",
        ),
        (
            "rl_spend",
            vec![Arg::Text("k"), Arg::Null, Arg::Integer(3)],
            "rl_spend: period must be 'hour', 'day', 'week', 'month' or 'year', got NULL",
        ),
        (
            "rl_spend",
            vec![Arg::Text("k"), Arg::Text("day"), Arg::Real(-0.5)],
            "rl_spend: quota must be a finite number greater than 0, got -0.5",
        ),
        (
            "rl_spend",
            vec![Arg::Text("k"), Arg::Text("day"), Arg::Integer(1), Arg::Real(1e-9)],
            "rl_spend: cost must be at least 0.000001, got 1e-9",
        ),
        (
            "rl_budget",
            vec![Arg::Text("k"), Arg::Text("day"), Arg::Blob(b"\xff")],
            "rl_budget: quota must be a finite number greater than 0, got a blob of 1 byte",
        ),
        (
            "rl_sweep",
            vec![Arg::Text("soon")],
            "rl_sweep: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 'soon'",
        ),
        ("rl_sweep", vec![Arg::Null, Arg::Integer(0)], "rl_sweep: max_rows must be a positive integer, got 0"),
        ("rl_sweep", vec![Arg::Null, Arg::Real(2.5)], "rl_sweep: max_rows must be a positive integer, got 2.5"),
    ];
    for (function, args, message) in cases {
        let result = match function {
            "rl_take" => calls::rl_take(&mut s, &args, &TEST_CLOCK),
            "rl_spend" => calls::rl_spend(&mut s, &args, &TEST_CLOCK),
            "rl_budget" => calls::rl_budget(&mut s, &args, &TEST_CLOCK),
            _ => calls::rl_sweep(&mut s, &args, &TEST_CLOCK).map(|n| n.to_string()),
        };
        let err = result.expect_err(message);
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert_eq!(err.to_string(), message);
    }
    let long = "x".repeat(1025);
    let err = calls::rl_take(&mut s, &[Arg::Text(&long), Arg::Integer(3), Arg::Integer(60)], &TEST_CLOCK).unwrap_err();
    assert_eq!(err.to_string(), "rl_take: key must be at most 1024 bytes, got 1025 bytes");
    assert!(calls::rl_take(&mut s, &[Arg::Text(&long[..1024]), Arg::Integer(3), Arg::Integer(60)], &TEST_CLOCK).is_ok());
    assert_eq!(s.writes, 1, "only the valid call wrote");
}

#[test]
fn explicit_clock_can_be_forbidden_and_read_only_refuses() {
    let mut s = MapStore::default();
    let strict = Clock { wall_ms: 1, explicit_allowed: false };
    let err = calls::rl_take(
        &mut s,
        &[Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Integer(1), Arg::Integer(0)],
        &strict,
    )
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ClockNotAllowed);
    assert!(calls::rl_take(
        &mut s,
        &[Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Integer(1), Arg::Null],
        &strict
    )
    .is_ok());
    s.read_only = true;
    let err = calls::rl_take(&mut s, &[Arg::Text("k"), Arg::Integer(3), Arg::Integer(60)], &strict).unwrap_err();
    assert_eq!(err.kind, ErrorKind::ReadOnly);
    assert!(err.to_string().starts_with("rl_take: "));
}

#[test]
fn keys_are_json_arrays_of_strings() {
    assert_eq!(encode_key(&[Arg::Text("share1"), Arg::Text("caller:2")]).unwrap(), r#"["share1","caller:2"]"#);
    assert_eq!(encode_key(&[Arg::Text("a\",\"b")]).unwrap(), r#"["a\",\"b"]"#);
    assert_ne!(encode_key(&[Arg::Text("a\",\"b")]).unwrap(), encode_key(&[Arg::Text("a"), Arg::Text("b")]).unwrap());
    assert_eq!(encode_key(&[Arg::Integer(7), Arg::Text("x")]).unwrap(), r#"["7","x"]"#);
    assert_eq!(encode_key(&[Arg::Text("a"), Arg::Null]).unwrap_err().to_string(), "rl_key: part 2 must not be NULL");
    assert!(encode_key(&[]).is_err());
}

#[test]
fn spend_args_round_decimals_to_millionths() {
    let args = [Arg::Text("k"), Arg::Text("day"), Arg::Text("12.345678"), Arg::Real(0.000001)];
    let a = SpendArgs::parse(&CallArgs::new(&ratelimit_core::functions::RL_SPEND, &args), &TEST_CLOCK).unwrap();
    assert_eq!(a.quota, 12_345_678);
    assert_eq!(a.cost, 1);
}

fn call(
    s: &mut MapStore,
    f: fn(&mut MapStore, &[Arg], &Clock) -> ratelimit_core::Result<String>,
    args: &[Arg],
) -> Value {
    parsed(f(s, args, &TEST_CLOCK).unwrap())
}

#[test]
fn peek_answers_like_take_and_changes_nothing() {
    let mut s = MapStore::default();
    take(&mut s, "k", 3.0, 60.0, 3.0, 0);
    let peek = call(
        &mut s,
        calls::rl_peek,
        &[Arg::Text("k"), Arg::Integer(3), Arg::Integer(60), Arg::Integer(1), Arg::Integer(500)],
    );
    assert_eq!(peek["admitted"], false);
    assert_eq!(peek["retry_after_ms"], 500);
    assert_eq!(s.writes, 1);
    assert_eq!(peek, take(&mut s, "k", 3.0, 60.0, 1.0, 500));
}

#[test]
fn refunds_never_exceed_burst_or_go_below_zero() {
    let mut s = MapStore::default();
    take(&mut s, "k", 5.0, 60.0, 4.0, 0);
    let r = call(
        &mut s,
        calls::rl_refund,
        &[Arg::Text("k"), Arg::Integer(5), Arg::Integer(60), Arg::Integer(2), Arg::Integer(0)],
    );
    assert_eq!(r, json!({"remaining": 3, "limit": 5, "reset_after_seconds": 2}));
    let r = call(
        &mut s,
        calls::rl_refund,
        &[Arg::Text("k"), Arg::Integer(5), Arg::Integer(60), Arg::Integer(100), Arg::Integer(0)],
    );
    assert_eq!(r["remaining"], 5);
    let untouched = call(
        &mut s,
        calls::rl_refund,
        &[Arg::Text("new"), Arg::Integer(5), Arg::Integer(60), Arg::Integer(1), Arg::Integer(0)],
    );
    assert_eq!(untouched["remaining"], 5);
    assert!(!s.buckets.contains_key("new"), "refunding a full bucket writes nothing");

    spend(&mut s, "b", "day", Arg::Integer(10), Arg::Real(2.5), 0);
    let r = call(&mut s, calls::rl_refund_budget, &[Arg::Text("b"), Arg::Text("day"), Arg::Real(1.5), Arg::Integer(0)]);
    assert_eq!(r, json!({"used": 1, "resets_at": 86400}));
    let r =
        call(&mut s, calls::rl_refund_budget, &[Arg::Text("b"), Arg::Text("day"), Arg::Integer(7), Arg::Integer(0)]);
    assert_eq!(r["used"], 0);
    let r = call(
        &mut s,
        calls::rl_refund_budget,
        &[Arg::Text("b"), Arg::Text("day"), Arg::Integer(1), Arg::Integer(86_400_000)],
    );
    assert_eq!(r, json!({"used": 0, "resets_at": 172800}), "an ended period has nothing to give back");
}

#[test]
fn reset_forgets_every_row_of_a_key() {
    let mut s = MapStore::default();
    take(&mut s, "k", 1.0, 1.0, 1.0, 0);
    spend(&mut s, "k", "day", Arg::Integer(1), Arg::Integer(1), 0);
    spend(&mut s, "k", "month", Arg::Integer(1), Arg::Integer(1), 0);
    spend(&mut s, "other", "month", Arg::Integer(1), Arg::Integer(1), 0);
    assert_eq!(calls::rl_reset(&mut s, &[Arg::Text("k")]).unwrap(), 3);
    assert_eq!(calls::rl_reset(&mut s, &[Arg::Text("k")]).unwrap(), 0);
    assert_eq!(take(&mut s, "k", 1.0, 1.0, 1.0, 0)["admitted"], true);
    assert_eq!(s.budgets.len(), 1);
}

fn take_all(s: &mut MapStore, limits: &str, now: i64) -> ratelimit_core::Result<Value> {
    calls::rl_take_all(s, &[Arg::Text(limits), Arg::Integer(now)], &TEST_CLOCK).map(parsed)
}

#[test]
fn take_all_charges_every_item_or_none() {
    let mut s = MapStore::default();
    let limits = r#"[{"key": "u", "burst": 2, "refill_per_minute": 60}, {"key": "u", "period": "day", "quota": 3, "cost": 1.5}]"#;
    let text = calls::rl_take_all(&mut s, &[Arg::Text(limits), Arg::Integer(0)], &TEST_CLOCK).unwrap();
    assert!(
        text.starts_with(r#"{"admitted":true,"retry_after_ms":0,"retry_after_seconds":0,"items":[{"admitted":true,"#),
        "{text}"
    );
    let r = parsed(text);
    assert_eq!(r["items"][0]["remaining"], 1);
    assert_eq!(r["items"][1]["used"], 1.5);
    let r = take_all(&mut s, limits, 0).unwrap();
    assert_eq!(r["admitted"], true);
    // the bucket would admit, the budget would not: nothing is charged
    let r = take_all(&mut s, r#"[{"key": "w", "burst": 3, "refill_per_minute": 60}, {"key": "u", "period": "day", "quota": 3, "cost": 1.5}]"#, 0).unwrap();
    assert_eq!(r["admitted"], false);
    assert_eq!(r["items"][0]["admitted"], true, "each item shows whether its limit alone admits");
    assert_eq!(r["items"][0]["remaining"], 3, "and what it has left now: nothing was charged");
    assert_eq!(r["items"][1]["admitted"], false);
    assert_eq!(r["retry_after_ms"], 86_400_000);
    assert_eq!(r["retry_after_seconds"], 86_400);
    assert!(!s.buckets.contains_key("w"), "the admitting bucket was not charged");
    // the longest wait wins
    let r = take_all(&mut s, r#"[{"key": "u", "burst": 2, "refill_per_minute": 60}, {"key": "v", "burst": 1, "refill_per_minute": 1, "cost": 2}]"#, 0).unwrap();
    assert_eq!(r["retry_after_ms"], 60_000);
    assert_eq!(s.atomic_depth, 0);
}

#[test]
fn an_items_multiplier_scales_its_limit_as_a_tier_does() {
    // a policy with tier "pro" (3x) and the same limits passed as items with multiplier 3
    // answer alike, kind by kind
    let mut s = MapStore::default();
    let items = r#"[{"key": "m", "burst": 2, "refill_per_minute": 2, "multiplier": 3},
                    {"key": "m", "period": "day", "quota": 2.5, "multiplier": 3},
                    {"key": "m", "limit": 1, "window_seconds": 60, "multiplier": 3}]"#;
    let r = take_all(&mut s, items, 0).unwrap();
    let limits: Vec<_> = r["items"].as_array().unwrap().iter().map(|i| i["limit"].clone()).collect();
    assert_eq!(limits, [serde_json::json!(6), serde_json::json!(7.5), serde_json::json!(3)]);
    let remaining: Vec<_> = r["items"].as_array().unwrap().iter().map(|i| i["remaining"].clone()).collect();
    assert_eq!(remaining, [serde_json::json!(5), serde_json::json!(6.5), serde_json::json!(2)]);
}

#[test]
fn take_all_rejects_bad_lists() {
    let mut s = MapStore::default();
    let cases = [
        ("{}", "rl_take_all: limits must be a JSON array of limit objects"),
        ("[]", "rl_take_all: limits must hold 1 to 64 items, got 0"),
        ("nope", "rl_take_all: limits must be valid JSON: expected ident at line 1 column 2"),
        (r#"[{"key": "a", "burst": 1, "refill_per_minute": 1}, {"key": "a", "burst": 2, "refill_per_minute": 1}]"#,
         "rl_take_all: items 1 and 2 are the same limit (one key may appear once per kind and period)"),
        (r#"[{"key": "a", "burst": 0, "refill_per_minute": 1}]"#, "rl_take_all: item 1: burst must be a finite number greater than 0, got 0"),
        (r#"[{"key": "a", "period": "day", "quota": 1}, {"key": "", "period": "day", "quota": 1}]"#, "rl_take_all: item 2: key must not be empty"),
        (r#"[{"key": "a", "burst": 1, "refil_per_minute": 1}]"#,
         "rl_take_all: item 1: unknown field \"refil_per_minute\" (a bucket has key, burst, refill_per_minute, cost, multiplier; a budget key, period, quota, cost, multiplier; a window key, limit, window_seconds, cost, multiplier; a fixed window key, limit, fixed_window_seconds, cost, multiplier)"),
        (r#"[{"key": "a", "period": "Year", "quota": 1}]"#, "rl_take_all: item 1: period must be 'hour', 'day', 'week', 'month' or 'year', got 'Year'"),
        (r#"[{"key": "a", "burst": true, "refill_per_minute": 1}]"#, "rl_take_all: item 1: burst must be a finite number greater than 0, got true"),
        (r#"[1]"#, "rl_take_all: item 1: must be a JSON object"),
        (r#"[{"key": "a", "burst": 1, "refill_per_minute": 1, "multiplier": 0}]"#,
         "rl_take_all: item 1: multiplier must be a finite number greater than 0, got 0"),
        (r#"[{"key": "a", "burst": 1, "refill_per_minute": 1, "cost": 0, "multiplier": 0}]"#,
         "rl_take_all: item 1: cost must be a finite number greater than 0, got 0"),
        (r#"[{"key": "a", "period": "day", "quota": 1, "multiplier": 1e-7}]"#,
         "rl_take_all: item 1: multiplier takes this limit out of range (a bucket's burst and refill must stay above 0 and at most 1000000000000000, a quota or window limit from 0.000001 to 1000000000)"),
        (r#"[{"key": "a", "burst": 1e15, "refill_per_minute": 1, "multiplier": 2}]"#,
         "rl_take_all: item 1: multiplier takes this limit out of range (a bucket's burst and refill must stay above 0 and at most 1000000000000000, a quota or window limit from 0.000001 to 1000000000)"),
    ];
    for (limits, message) in cases {
        assert_eq!(take_all(&mut s, limits, 0).unwrap_err().to_string(), message.replace("\\\"", "\""));
    }
    let many = format!(
        "[{}]",
        (0..65)
            .map(|i| format!(r#"{{"key": "k{i}", "burst": 1, "refill_per_minute": 1}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert_eq!(
        take_all(&mut s, &many, 0).unwrap_err().to_string(),
        "rl_take_all: limits must hold 1 to 64 items, got 65"
    );
    // a bucket and a budget under one key, and two periods, are different limits
    assert!(take_all(&mut s, r#"[{"key": "a", "burst": 1, "refill_per_minute": 1}, {"key": "a", "period": "day", "quota": 1}, {"key": "a", "period": "month", "quota": 1}]"#, 0).is_ok());
    assert_eq!(s.writes, 3);
}

#[test]
fn headers_for_every_result_shape() {
    let h = |v: &Value| parsed(headers_of(&v.to_string()).unwrap());
    let mut s = MapStore::default();
    let admitted = take(&mut s, "k", 10.0, 60.0, 1.0, 0);
    assert_eq!(
        h(&admitted),
        json!({
        "RateLimit-Policy": "\"bucket\";q=10;w=10", "RateLimit": "\"bucket\";r=9;t=1",
        "X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": "1"})
    );
    take(&mut s, "k", 10.0, 60.0, 9.0, 0);
    let refused = take(&mut s, "k", 10.0, 60.0, 1.0, 1);
    let headers = h(&refused);
    assert_eq!(headers["Retry-After"], "1", "rounded up, never 0 while limited");
    let budget = spend(&mut s, "b", "day", Arg::Integer(2), Arg::Real(1.5), 0);
    assert_eq!(
        h(&budget),
        json!({
        "RateLimit-Policy": "\"budget\";q=2;w=86400", "RateLimit": "\"budget\";r=0;t=86400",
        "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0.5", "X-RateLimit-Reset": "86400"})
    );
    let over = spend(&mut s, "b", "day", Arg::Integer(2), Arg::Integer(1), 3_600_000);
    assert_eq!(h(&over)["Retry-After"], "82800");
    assert_eq!(h(&over)["RateLimit"], "\"budget\";r=0;t=82800");
    // one meaning for every kind: seconds until whole again (the period's end here), as t=
    assert_eq!(h(&over)["X-RateLimit-Reset"], "82800");
    let all = take_all(
        &mut s,
        r#"[{"key": "k", "burst": 10, "refill_per_minute": 60}, {"key": "b", "period": "day", "quota": 2}]"#,
        2,
    )
    .unwrap();
    let headers = h(&all);
    assert_eq!(headers["RateLimit-Policy"], "\"bucket-1\";q=10;w=10, \"budget-2\";q=2;w=86400");
    assert_eq!(headers["Retry-After"], all["retry_after_seconds"].to_string());
    let refund = call(
        &mut s,
        calls::rl_refund,
        &[Arg::Text("k"), Arg::Integer(10), Arg::Integer(60), Arg::Integer(1), Arg::Integer(2)],
    );
    assert!(h(&refund).get("Retry-After").is_none());
    // a cost above the limit is never admitted: no Retry-After to obey
    let never = take(&mut s, "n", 3.0, 60.0, 5.0, 0);
    assert_eq!((never["admitted"].clone(), never["exceeds_limit"].clone()), (json!(false), json!(true)));
    assert!(h(&never).get("Retry-After").is_none());
    let never_all = take_all(&mut s, r#"[{"key": "n", "period": "day", "quota": 2, "cost": 3}]"#, 0).unwrap();
    assert_eq!(never_all["items"][0]["exceeds_limit"], true);
    assert!(h(&never_all).get("Retry-After").is_none());
    assert!(headers_of(r#"{"used": 1, "resets_at": 5}"#).is_err());
    assert!(headers_of("[]").is_err());
}

fn state_strategy() -> impl Strategy<Value = (f64, i64)> {
    (0.0f64..200.0, 0i64..100_000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]
    #[test]
    fn bucket_invariants(
        burst in prop_oneof![1.0f64..200.0, Just(1.0), Just(3.0)],
        rate in prop_oneof![0.01f64..200_000.0, Just(7.0), Just(0.5), Just(100_000.0)],
        cost in 0.01f64..50.0,
        (level, refilled_at) in state_strategy(),
        dt in -50_000i64..500_000,
    ) {
        let limits = BucketLimits { burst, refill_per_minute: rate };
        let state = BucketState { level: level.min(burst), refilled_at, full_at: 0 };
        let now = (refilled_at + dt).max(0);
        let d = bucket::take(Some(&state), &limits, cost, now);
        match d.new_state {
            Some(new) => {
                prop_assert!(d.admitted);
                prop_assert!(new.level >= 0.0 && new.level <= burst);
                prop_assert!(new.refilled_at >= state.refilled_at, "times never move back");
                prop_assert_eq!(d.retry_after_ms, 0);
            }
            None => {
                prop_assert!(!d.admitted);
                prop_assert!(d.retry_after_ms >= 1);
                if cost <= burst {
                    let wait = d.retry_after_ms;
                    prop_assert!(bucket::take(Some(&state), &limits, cost, now + wait).admitted, "waiting retry_after_ms admits");
                    prop_assert!(!bucket::take(Some(&state), &limits, cost, now + wait - 1).admitted, "1 ms less does not");
                }
            }
        }
        prop_assert!(d.remaining >= 0 && (d.remaining as f64) <= burst);
    }

    #[test]
    fn budget_never_exceeds_quota(quota in 1i64..5_000_000, costs in prop::collection::vec(1i64..2_000_000, 1..30)) {
        let mut state: Option<BudgetState> = None;
        for cost in costs {
            let d = budget::spend(state.as_ref(), Period::plain(Unit::Day), quota, cost, 1000);
            if d.admitted {
                state = d.new_state;
            } else {
                prop_assert_eq!(d.used, state.map_or(0, |s| s.used), "a refusal keeps the count");
                prop_assert!(d.new_state.is_none(), "and with the same quota writes nothing");
                prop_assert!(d.retry_after_seconds >= 1);
            }
            prop_assert!(d.used <= quota);
        }
    }
}

/// The memory store's table in plain vectors, one per part (one thread: no locks needed).
struct VecTable(Vec<Vec<u64>>);

impl VecTable {
    fn new(capacity: usize) -> Self {
        let per_part = memory::part_capacity(capacity);
        VecTable(
            (0..memory::PARTS)
                .map(|_| {
                    let mut words = vec![0u64; memory::part_bytes(per_part) / 8];
                    memory::format_part(bytemuck::cast_slice_mut(&mut words), per_part);
                    words
                })
                .collect(),
        )
    }

    fn stats(&self) -> memory::MemoryStats {
        let mut stats = memory::MemoryStats::default();
        for part in &self.0 {
            stats.add(&memory::PartRef::new(bytemuck::cast_slice(part)).header());
        }
        stats
    }
}

impl SharedTable for VecTable {
    fn hash(&self, key: &str) -> memory::Hash {
        memory::bucket_hash([7, 9], 1, key)
    }

    fn database(&self) -> u32 {
        1
    }

    fn read<R>(&mut self, part: usize, work: impl FnOnce(&memory::PartRef) -> R) -> R {
        work(&memory::PartRef::new(bytemuck::cast_slice(&self.0[part])))
    }

    fn write<R>(&mut self, parts: &[usize], work: impl FnOnce(&mut [memory::Part]) -> R) -> R {
        let mut held: Vec<memory::Part> = self
            .0
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| parts.contains(i))
            .map(|(_, words)| memory::Part::new(bytemuck::cast_slice_mut(words)))
            .collect();
        work(&mut held)
    }
}

/// Random calls with explicit clocks on a few keys, each sent to the table store and to the
/// memory store (large enough never to evict): every answer is the same text.
#[test]
fn the_memory_store_answers_like_the_table_store() {
    use ratelimit_core::functions as f;
    let mut table = MapStore::default();
    let mut memory = MemoryStore { buckets: VecTable::new(1024), table: MapStore::default() };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut now = 0i64;
    for step in 0..30_000 {
        now += next(700) as i64;
        let key = ["a", "b", "c", "d"][next(4) as usize];
        let other = ["a", "b", "c", "d"][next(4) as usize];
        // Each key keeps its limits: a swept row then answers like no row, whichever rows
        // each store's sweep picked.
        let limits_of = |k: &str| match k {
            "a" => (1.0, 7.0),
            "b" => (3.0, 60.0),
            "c" => (10.0, 600.0),
            _ => (3.0, 0.5),
        };
        let (burst, rate) = limits_of(key);
        let cost = 1.0 + next(3) as f64;
        let limits = format!(
            r#"[{{"key": "{key}", "burst": {burst}, "refill_per_minute": {rate}, "cost": {cost}}},
                {{"key": "{other}x", "burst": 2, "refill_per_minute": 30}},
                {{"key": "{key}", "period": "day", "quota": 50}}]"#
        );
        let call: (&f::Function, Vec<Arg>) = match next(8) {
            0 | 1 => (
                &f::RL_TAKE,
                vec![Arg::Text(key), Arg::Real(burst), Arg::Real(rate), Arg::Real(cost), Arg::Integer(now)],
            ),
            2 => (
                &f::RL_PEEK,
                vec![Arg::Text(key), Arg::Real(burst), Arg::Real(rate), Arg::Real(cost), Arg::Integer(now)],
            ),
            3 => (
                &f::RL_REFUND,
                vec![Arg::Text(key), Arg::Real(burst), Arg::Real(rate), Arg::Real(cost), Arg::Integer(now)],
            ),
            4 => (&f::RL_TAKE_ALL, vec![Arg::Text(&limits), Arg::Integer(now)]),
            5 => (&f::RL_SWEEP, vec![Arg::Integer(now)]),
            6 if next(20) == 0 => (&f::RL_RESET, vec![Arg::Text(key)]),
            _ => (
                &f::RL_SPEND,
                vec![Arg::Text(key), Arg::Text("day"), Arg::Integer(50), Arg::Integer(1), Arg::Integer(now)],
            ),
        };
        let (function, args) = call;
        let expected = ratelimit_core::calls::call(function, &mut table, &args, &TEST_CLOCK);
        let got = ratelimit_core::calls::call(function, &mut memory, &args, &TEST_CLOCK);
        assert_eq!(got, expected, "step {step}: {} {args:?}", function.name);
    }
    assert_eq!(memory.buckets.stats().evicted_early, 0);
    assert_eq!(memory.table.buckets.len(), 0, "no bucket row reaches the table");
}

/// Buckets work read-only in the memory store; budgets do not.
#[test]
fn memory_buckets_work_where_the_table_is_read_only() {
    let mut memory =
        MemoryStore { buckets: VecTable::new(64), table: MapStore { read_only: true, ..MapStore::default() } };
    let take = ratelimit_core::calls::call(
        &ratelimit_core::functions::RL_TAKE,
        &mut memory,
        &[Arg::Text("k"), Arg::Real(1.0), Arg::Real(1.0), Arg::Real(1.0), Arg::Integer(0)],
        &TEST_CLOCK,
    );
    assert!(take.is_ok(), "{take:?}");
    let spend = ratelimit_core::calls::call(
        &ratelimit_core::functions::RL_SPEND,
        &mut memory,
        &[Arg::Text("k"), Arg::Text("day"), Arg::Integer(1), Arg::Integer(1), Arg::Integer(0)],
        &TEST_CLOCK,
    );
    assert_eq!(spend.unwrap_err().kind, ErrorKind::ReadOnly);
    assert_eq!(memory.buckets.stats().in_use, 1);
}

/// A flood of distinct keys through a small table: never an error, and a key in use that
/// is not yet full again survives as long as full buckets can be replaced instead.
#[test]
fn a_key_flood_replaces_full_buckets_first() {
    use ratelimit_core::functions as f;
    let mut memory = MemoryStore { buckets: VecTable::new(1024), table: MapStore::default() };
    let take = |m: &mut MemoryStore<VecTable, MapStore>, key: &str, burst: f64, rate: f64, now: i64| {
        let args = [Arg::Text(key), Arg::Real(burst), Arg::Real(rate), Arg::Real(1.0), Arg::Integer(now)];
        parsed(
            ratelimit_core::calls::call(&f::RL_TAKE, m, &args, &TEST_CLOCK)
                .map(|a| match a {
                    ratelimit_core::Answer::Json(j) => j.to_text(),
                    other => panic!("{other:?}"),
                })
                .unwrap(),
        )
    };
    // The legitimate key: burst 1, full again after a minute.
    assert_eq!(take(&mut memory, "user", 1.0, 1.0, 0)["admitted"], true);
    // Flood keys, one every 10 ms, each full again 1 s after its take: about 100 in use at
    // any time, fewer than the table holds, so only full buckets are replaced.
    for i in 0..3_000 {
        assert_eq!(take(&mut memory, &format!("flood{i}"), 1000.0, 60.0, 2000 + 10 * i)["admitted"], true);
    }
    let stats = memory.buckets.stats();
    assert_eq!((stats.in_use, stats.evicted_early), (stats.capacity, 0), "{stats:?}");
    assert!(stats.evicted_full > 1900, "{stats:?}");
    assert_eq!(take(&mut memory, "user", 1.0, 1.0, 32_000)["admitted"], false, "the flood did not reset the user");
    // A flood faster than the table (full again 10 s after, one every ms): now buckets go
    // before they are full again, soonest full first, so the user's (full at 60 s)
    // outlasts every flood key.
    for i in 0..3_000 {
        assert_eq!(take(&mut memory, &format!("fast{i}"), 1000.0, 6.0, 33_000 + i)["admitted"], true);
    }
    assert!(memory.buckets.stats().evicted_early > 1900, "{:?}", memory.buckets.stats());
    assert_eq!(take(&mut memory, "user", 1.0, 1.0, 37_000)["admitted"], false, "the user's bucket went last");
}

/// rl_window against a model that keeps every admission forever and counts those in
/// (now - W, now]: the same decisions, and every refusal's retry time exact (waiting it
/// admits, 1 ms less does not).
#[test]
fn windows_answer_like_a_model_that_forgets_nothing() {
    let mut rng = 0x2026_1130_u64;
    let mut next = |n: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    for round in 0..20 {
        let mut s = MapStore::default();
        let (limit, window_ms) = (1 + next(6) as i64, 1 + next(2000) as i64);
        let mut admitted: Vec<(i64, i64)> = Vec::new();
        let used = |admitted: &[(i64, i64)], now: i64| -> i64 {
            admitted.iter().filter(|(t, _)| *t > now - window_ms).map(|(_, c)| c).sum()
        };
        let mut now = 0;
        for _ in 0..300 {
            now += next(3) as i64 * next(200) as i64;
            let cost = 1 + next(3) as i64;
            let args = [
                Arg::Text("w"),
                Arg::Integer(limit),
                Arg::Real(window_ms as f64 / 1000.0),
                Arg::Integer(cost),
                Arg::Integer(now),
            ];
            let r = call(&mut s, calls::rl_window, &args);
            let expected = used(&admitted, now) + cost <= limit;
            assert_eq!(r["admitted"], expected, "round {round} at {now}: {r}");
            if expected {
                admitted.push((now, cost));
                assert_eq!(r["remaining"], limit - used(&admitted, now));
            } else {
                let retry = r["retry_after_ms"].as_i64().unwrap();
                let later = |t: i64| used(&admitted, t) + cost <= limit;
                assert!(retry >= 1 && (cost > limit || (later(now + retry) && !later(now + retry - 1))), "{r}");
                if cost <= limit {
                    let peek_at = |s: &mut MapStore, t: i64| {
                        let args = [args[0], args[1], args[2], args[3], Arg::Integer(t)];
                        call(s, calls::rl_window_peek, &args)["admitted"].as_bool().unwrap()
                    };
                    assert!(peek_at(&mut s, now + retry) && !peek_at(&mut s, now + retry - 1), "{r}");
                }
            }
        }
        assert!(s.entries.values().all(|row| row.entries.split(',').count() <= limit as usize));
    }
}

#[test]
fn a_window_too_large_to_keep_exactly_is_an_error_that_writes_nothing() {
    let mut s = MapStore::default();
    let window = |s: &mut MapStore, now: i64| {
        calls::rl_window(
            s,
            &[Arg::Text("w"), Arg::Integer(1_000_000), Arg::Integer(3600), Arg::Integer(1), Arg::Integer(now)],
            &TEST_CLOCK,
        )
    };
    // 10 000 entries, one per millisecond from 0, as that many calls would leave them
    let full = std::iter::once("0").chain(std::iter::repeat_n("1", 9_999)).collect::<Vec<_>>().join(",");
    s.entries.insert(("w".to_owned(), "window".to_owned()), EntriesRow { entries: full, empty_at: 9_999 + 3_600_000 });
    let writes = s.writes;
    let e = window(&mut s, 10_000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::LimitExceeded);
    assert_eq!(s.writes, writes);
    assert_eq!(parsed(window(&mut s, 9_999).unwrap())["admitted"], true, "a merge needs no new entry");
    // an hour later every entry has left: the window starts again
    assert_eq!(parsed(window(&mut s, 3_610_000).unwrap())["remaining"], 999_999);
    let row = &s.entries[&("w".to_owned(), "window".to_owned())];
    assert_eq!((row.entries.as_str(), row.empty_at), ("3610000", 3_610_000 + 3_600_000));
}

#[test]
fn leases_count_until_released_or_expired() {
    let mut s = MapStore::default();
    let acquire = |s: &mut MapStore, now: i64| {
        call(s, calls::rl_acquire, &[Arg::Text("j"), Arg::Integer(1), Arg::Integer(10), Arg::Integer(now)])
    };
    let first = acquire(&mut s, 0);
    let lease = first["lease"].as_str().unwrap().to_owned();
    assert_eq!(acquire(&mut s, 5_000)["retry_after_ms"], 5_000);
    let writes = s.writes;
    assert_eq!(acquire(&mut s, 9_999)["admitted"], false);
    assert_eq!(s.writes, writes, "a refusal writes nothing");
    let release = |s: &mut MapStore, now: i64| {
        calls::rl_release(s, &[Arg::Text("j"), Arg::Text(&lease), Arg::Integer(now)], &TEST_CLOCK).unwrap()
    };
    assert!(release(&mut s, 1_000));
    assert!(!release(&mut s, 1_000));
    assert_eq!(s.writes, writes + 1, "a release that finds nothing writes nothing");
    let second = acquire(&mut s, 2_000);
    let second_id = second["lease"].as_str().unwrap().to_owned();
    assert_eq!(second["admitted"], json!(true));
    assert!(second_id.starts_with("2000-2-") && second_id != lease, "{second_id}");
    let in_flight =
        |s: &mut MapStore, now: i64| calls::rl_in_flight(s, &[Arg::Text("j"), Arg::Integer(now)], &TEST_CLOCK).unwrap();
    assert_eq!((in_flight(&mut s, 11_999), in_flight(&mut s, 12_000)), (1, 0), "expired at once, no sweep");
    let renewed =
        call(&mut s, calls::rl_renew, &[Arg::Text("j"), Arg::Text(&second_id), Arg::Integer(60), Arg::Integer(11_000)]);
    assert_eq!(renewed, json!({"renewed": true, "expires_at": 71_000}));
    assert_eq!(s.entries[&("j".to_owned(), "lease".to_owned())].empty_at, 71_000, "the sweep waits for it");
}

#[test]
fn a_charge_into_debt_is_repaid_by_refill_to_the_millisecond() {
    let mut s = MapStore::default();
    let charged = call(
        &mut s,
        calls::rl_charge,
        &[Arg::Text("c"), Arg::Integer(2), Arg::Integer(60), Arg::Integer(5), Arg::Integer(0)],
    );
    assert_eq!((charged["admitted"].clone(), charged["remaining"].clone()), (json!(true), json!(-3)));
    let r = take(&mut s, "c", 2.0, 60.0, 1.0, 0);
    assert_eq!(r["retry_after_ms"], 4_000);
    assert_eq!(take(&mut s, "c", 2.0, 60.0, 1.0, 3_999)["admitted"], false);
    assert_eq!(take(&mut s, "c", 2.0, 60.0, 1.0, 4_000)["admitted"], true);
}

/// rl_check of a one-bucket policy answers alike whether the store can take the
/// one-statement path (with a policy epoch or by checking revisions) or not: through
/// A failed piece of work gives back what its check took, on every store: the bucket,
/// budget and window of a policy are as before the check, and a refusal that followed
/// the check is admitted after the refund.
#[test]
fn a_refunded_check_leaves_every_limit_as_before() {
    let definition = r#"{"limits": [{"burst": 2, "refill_per_minute": 0.000001}, {"period": "day", "quota": 2},
                                     {"limit": 2, "window_seconds": 60}], "tiers": {"pro": 2}}"#;
    for tier in [Arg::Null, Arg::Text("pro")] {
        let mut s = MapStore::default();
        call(&mut s, calls::rl_policy_set, &[Arg::Text("p"), Arg::Text(definition)]);
        let args = [Arg::Text("p"), Arg::Text("ann"), Arg::Integer(1), tier, Arg::Integer(1000)];
        let scale = if tier == Arg::Null { 1 } else { 2 };
        for _ in 0..2 * scale {
            assert_eq!(call(&mut s, calls::rl_check, &args)["admitted"], true);
        }
        assert_eq!(call(&mut s, calls::rl_check, &args)["admitted"], false);
        let refund = call(&mut s, calls::rl_refund_check, &args);
        assert_eq!(refund["items"][0]["remaining"], 1);
        assert_eq!(refund["items"][1]["used"], 2 * scale - 1);
        assert_eq!(refund["items"][2]["remaining"], 1);
        assert_eq!(call(&mut s, calls::rl_check, &args)["admitted"], true);
    }
}

/// A refund for a subject that never checked finds nothing to give back and writes no
/// row (the web packages' startup check of a policy relies on it).
#[test]
fn a_refund_for_a_subject_without_rows_writes_nothing() {
    let definition = r#"{"limits": [{"burst": 2, "refill_per_minute": 1}, {"period": "day", "quota": 2},
                                     {"limit": 2, "window_seconds": 60}]}"#;
    let mut s = MapStore::default();
    call(&mut s, calls::rl_policy_set, &[Arg::Text("p"), Arg::Text(definition)]);
    let writes = s.writes;
    let args = [Arg::Text("p"), Arg::Text("nobody"), Arg::Integer(1), Arg::Null, Arg::Integer(1000)];
    let refund = call(&mut s, calls::rl_refund_check, &args);
    assert_eq!(
        (refund["items"][0]["remaining"].clone(), refund["items"][2]["remaining"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(s.writes, writes);
    assert!(s.buckets.is_empty() && s.budgets.is_empty() && s.entries.is_empty());
}

/// admissions, refusals, a tier, a policy changed by another session and a strike; once
/// the policy is cached, an admitted check is that one statement.
#[test]
fn one_bucket_checks_answer_alike_on_either_path() {
    let policy = |refill: i64| {
        format!(r#"{{"limits": [{{"burst": 3, "refill_per_minute": {refill}}}], "tiers": {{"pro": 2}}}}"#)
    };
    let mut stores = [
        MapStore { checks_in_one_statement: true, checks_epoch: Some(0), ..MapStore::default() },
        MapStore { checks_in_one_statement: true, ..MapStore::default() },
        MapStore::default(),
    ];
    let mut answers = Vec::new();
    for s in stores.iter_mut() {
        let mut out = Vec::new();
        let check = |s: &mut MapStore, subject: &str, tier: Arg, now: i64| {
            let args = [Arg::Text("p"), Arg::Text(subject), Arg::Integer(1), tier, Arg::Integer(now)];
            calls::rl_check(s, &args, &TEST_CLOCK).unwrap()
        };
        calls::rl_policy_set(s, &[Arg::Text("p"), Arg::Text(&policy(60))], &TEST_CLOCK).unwrap();
        let t = 1_000_000;
        for i in 0..5 {
            out.push(check(s, "alice", Arg::Null, t + i));
        }
        out.push(check(s, "bob", Arg::Text("pro"), t));
        out.push(check(s, "bob", Arg::Text("pro"), t + 1));
        // another session's new refill rate: 10 ms of it give alice a token the old one would not
        s.put_policy("p", &policy(6000), 7).unwrap();
        out.push(check(s, "alice", Arg::Null, t + 12));
        out.push(check(s, "alice", Arg::Null, t + 22));
        let strike = [0, 60, 3600, 3600].map(Arg::Integer);
        let strike = [&[Arg::Text("bob")], &strike[..], &[Arg::Integer(t + 20)]].concat();
        calls::rl_penalize(s, &strike, &TEST_CLOCK).unwrap();
        out.push(check(s, "bob", Arg::Text("pro"), t + 30));
        out.push(check(s, "bob", Arg::Text("pro"), t + 120_021));
        answers.push(out);
    }
    assert_eq!(answers[0], answers[2]);
    assert_eq!(answers[1], answers[2]);
    // alice's 2nd and 3rd, bob's 2nd, alice's 2nd under the new policy: a known policy, an
    // existing row, an admission, no strikes
    let counts = stores.each_ref().map(|s| s.one_statement_checks);
    assert_eq!(counts, [4, 4, 0]);
    let admitted: Vec<bool> = answers[0].iter().map(|a| parsed(a.clone())["admitted"].as_bool().unwrap()).collect();
    // bob's strike (no free ones) blocks him for 120 s
    assert_eq!(admitted, [true, true, true, false, false, true, true, true, true, false, true]);
}

/// The checks epoch: a strike alone leaves it (checks of others stay one statement), a new
/// block moves it and is refused at once, and with more subjects under strikes than a
/// thread lists, each check finds the subject's strikes in its statement instead.
#[test]
fn new_blocks_move_the_checks_epoch() {
    let mut s = MapStore { checks_in_one_statement: true, checks_epoch: Some(0), ..MapStore::default() };
    let policy = r#"{"limits": [{"burst": 100, "refill_per_minute": 60}]}"#;
    calls::rl_policy_set(&mut s, &[Arg::Text("p"), Arg::Text(policy)], &TEST_CLOCK).unwrap();
    let t = 1_000_000;
    let check = |s: &mut MapStore, subject: &str| {
        let answer = calls::rl_check(
            s,
            &[Arg::Text("p"), Arg::Text(subject), Arg::Integer(1), Arg::Null, Arg::Integer(t)],
            &TEST_CLOCK,
        );
        parsed(answer.unwrap())["admitted"].as_bool().unwrap()
    };
    let penalize = |s: &mut MapStore, subject: &str, free: i64| {
        let args = [
            Arg::Text(subject),
            Arg::Integer(free),
            Arg::Integer(60),
            Arg::Integer(3600),
            Arg::Integer(3600),
            Arg::Integer(t),
        ];
        calls::rl_penalize(s, &args, &TEST_CLOCK).unwrap();
    };
    for subject in ["alice", "bob", "alice", "bob"] {
        assert!(check(&mut s, subject));
    }
    assert_eq!(s.one_statement_checks, 2);
    penalize(&mut s, "carol", 3);
    assert_eq!(s.checks_epoch, Some(1), "a strike without a block leaves the epoch");
    assert!(check(&mut s, "alice"));
    assert_eq!(s.one_statement_checks, 3);
    penalize(&mut s, "alice", 0);
    assert_eq!(s.checks_epoch, Some(2), "a new block moves it");
    assert!(!check(&mut s, "alice"));
    assert!(check(&mut s, "bob"));
    assert!(check(&mut s, "bob"));
    assert_eq!(s.one_statement_checks, 5, "alice's refusal listed the blocks again: bob's checks are one statement");
    // more subjects under strikes than a thread lists: bob is checked by the statement's
    // own test (no strikes on him), alice still refused
    for i in 0..=ratelimit_core::policy_cache::KNOWN_STRIKE_ROWS {
        penalize(&mut s, &format!("s{i}"), 3);
    }
    penalize(&mut s, "dave", 0);
    assert!(!check(&mut s, "alice"));
    assert!(check(&mut s, "bob"));
    assert!(check(&mut s, "bob"));
    assert_eq!(s.one_statement_checks, 7);
    assert!(!check(&mut s, "dave"));
}

/// Derived keys never collide: names and subjects that contain the separator or digits,
/// empty ones, and every limit index.
#[test]
fn derived_keys_are_distinct() {
    let parts = ["", "a", "a:", ":a", "1", "a:1", "1:a", "a:0:b", "\u{1}", "é"];
    let mut keys = std::collections::HashSet::new();
    for policy in parts {
        for subject in parts {
            for i in [0, 1, 10] {
                let key = ratelimit_core::policy::Policy::key(policy, subject, i);
                assert!(keys.insert(key.clone()), "{policy:?} {subject:?} {i} -> {key:?} again");
            }
        }
    }
}

/// The compact answers on one store are what the headers of the JSON answers on a twin store
/// show: `admitted`, then X-RateLimit-Limit, -Remaining, -Reset and Retry-After (0 where
/// absent), for buckets, budgets, windows and several at once, admitted and refused.
#[test]
fn compact_answers_are_the_headers_of_the_json_answers() {
    use ratelimit_core::functions as f;
    use ratelimit_core::Answer;
    let (mut json_store, mut compact_store) = (MapStore::default(), MapStore::default());
    let mut seed = 58u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut now = 1_700_000_000_000i64;
    let mut refused = 0;
    for step in 0..3000 {
        now += [0, 100, 1000, 9000][next(4) as usize];
        let cost = [1.0, 1.0, 2.0, 0.5, 40.0][next(5) as usize];
        let limits = match next(4) {
            0 => format!(r#"[{{"key": "b", "burst": 5, "refill_per_minute": 30, "cost": {cost}}}]"#),
            1 => format!(
                r#"[{{"key": "d", "period": "day", "quota": 7.5, "cost": {cost}}}, {{"key": "w", "limit": 4, "window_seconds": 20, "cost": {cost}}}]"#
            ),
            2 => format!(
                r#"[{{"key": "f", "limit": 3, "fixed_window_seconds": 10, "cost": {cost}}}, {{"key": "b", "burst": 5, "refill_per_minute": 30}}]"#
            ),
            _ => String::new(),
        };
        let (function, compact, args): (&f::Function, &f::Function, Vec<Arg>) = if limits.is_empty() {
            let args = vec![Arg::Text("k"), Arg::Real(4.0), Arg::Real(12.0), Arg::Real(cost), Arg::Integer(now)];
            (&f::RL_TAKE, &f::RL_TAKE_COMPACT, args)
        } else {
            (&f::RL_TAKE_ALL, &f::RL_TAKE_ALL_COMPACT, vec![Arg::Text(&limits), Arg::Integer(now)])
        };
        let answer = ratelimit_core::calls::call(function, &mut json_store, &args, &TEST_CLOCK).unwrap();
        let Answer::Json(answer) = answer else { panic!("{answer:?}") };
        let headers = parsed(headers_of(&answer.to_text()).unwrap());
        let admitted = answer.to_text().starts_with(r#"{"admitted":true"#);
        refused += usize::from(!admitted);
        let header = |name: &str| headers.get(name).and_then(Value::as_str).unwrap_or("0").to_owned();
        let expected = format!(
            "{} {} {} {} {}",
            u8::from(admitted),
            header("X-RateLimit-Limit"),
            header("X-RateLimit-Remaining"),
            header("X-RateLimit-Reset"),
            header("Retry-After")
        );
        let got = ratelimit_core::calls::call(compact, &mut compact_store, &args, &TEST_CLOCK).unwrap();
        assert_eq!(got, Answer::Text(expected), "step {step}: {} {args:?}", compact.name);
    }
    assert!(refused > 300, "the run refuses too: {refused}");
}

/// A value inside a JSON argument shows in an error as what it is: an engine's blob is
/// bytes, a JSON boolean, array or object is none of those.
#[test]
fn every_kind_of_value_is_described_as_what_it_is() {
    let cases: [(Value, &str); 7] = [
        (serde_json::json!(null), "NULL"),
        (serde_json::json!(5), "5"),
        (serde_json::json!(2.5), "2.5"),
        (serde_json::json!("day"), "'day'"),
        (serde_json::json!(true), "true"),
        (serde_json::json!([5]), "a JSON array"),
        (serde_json::json!({"limits": []}), "a JSON object"),
    ];
    for (value, shown) in cases {
        assert_eq!(ratelimit_core::args::json_arg(&value).describe(), shown, "{value}");
    }
    assert_eq!(Arg::Blob(b"\xff").describe(), "a blob of 1 byte");
    assert_eq!(Arg::Blob(b"\xff\xfe").describe(), "a blob of 2 bytes");
}
