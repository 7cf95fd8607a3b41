//! The store of both SQL engines, written once over the few things an engine does: run a
//! statement of [`crate::sql`] with bound values, read one row, begin and end a unit.
//! Which statement serves which store method, and the order of its parameters, live here.

use crate::bucket;
use crate::bucket::BucketState;
use crate::budget::{BudgetState, NearBudget, UsagePeriod};
use crate::decision_slot::{self, Decide};
use crate::sql::{Statement, Value};
use crate::store::{
    BucketRows, BudgetAt, ChangeResult, Changed, PolicyGuard, RowAt, StoreError, StoreResult, StoredPolicy, TableRow,
    TableRows, UsageOf,
};
use crate::take_all::BucketItem;
use crate::units::Period;

/// What an SQL engine provides.
pub trait SqlEngine {
    /// See [`TableRows::LOCKS_ROWS`].
    const LOCKS_ROWS: bool;
    /// Whether the database or transaction refuses writes.
    fn read_only(&mut self) -> StoreResult<bool>;
    /// Runs a statement that changes rows (prepared once per connection); returns how many.
    fn execute(&mut self, statement: Statement, params: &[Value]) -> StoreResult<u64>;
    /// Runs a statement that returns at most one row, of the types in `statement.columns()`.
    fn query_row(&mut self, statement: Statement, params: &[Value]) -> StoreResult<Option<Vec<Value<'static>>>>;
    /// See [`TableRows::begin_unit`].
    fn begin_unit(&mut self) -> StoreResult<bool>;
    /// See [`TableRows::end_unit`].
    fn end_unit(&mut self, owned: bool, commit: bool) -> StoreResult<()>;
    /// Whether the engine runs the guarded UPDATEs, whose WHERE and SET clauses call back
    /// into the call in progress. Citus refuses them on distributed tables (their functions
    /// are VOLATILE); there a single-row change locks the row, decides and compares and sets.
    fn runs_guarded_updates(&mut self) -> StoreResult<bool> {
        Ok(true)
    }
    /// How this call changes a bucket row: the one place the choice is made.
    fn bucket_write(&mut self) -> StoreResult<BucketWrite> {
        Ok(if self.runs_guarded_updates()? { BucketWrite::GuardedUpdate } else { BucketWrite::LockAndCompare })
    }
    /// Changes the bucket row of `key` as the guarded UPDATE would, without a statement
    /// ([`BucketWrite::InPlace`]): the engine finds the row, decides on it, writes, and
    /// decides again on a newer version it meets. None: the table is not in a shape that
    /// allows it, so the guarded UPDATE runs.
    fn change_bucket_in_place(
        &mut self,
        _key: &str,
        _decide: &Decide<BucketState>,
    ) -> Option<ChangeResult<BucketState>> {
        None
    }
    /// Runs a statement that returns rows, of the types in `statement.columns()`.
    fn query_rows(&mut self, statement: Statement, params: &[Value]) -> StoreResult<Vec<Vec<Value<'static>>>>;
    /// See [`TableRows::CHECKS_EPOCH_IN_MEMORY`].
    const CHECKS_EPOCH_IN_MEMORY: bool;
    /// See [`TableRows::checks_epoch`].
    fn checks_epoch(&mut self) -> Option<u64>;
    /// See [`TableRows::checks_changed`].
    fn checks_changed(&mut self) -> StoreResult<()>;
}

/// The ways a bucket row (rl_take, rl_refund, rl_charge) is changed, chosen per call by
/// [`SqlEngine::bucket_write`]. ARCHITECTURE.md's table says when each applies and which
/// tests cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketWrite {
    /// `sql/statements/bucket_change.sql`: one UPDATE whose WHERE and SET clauses ask the decision of
    /// the call in progress ([`decision_slot`]). SQLite always; PostgreSQL by default.
    GuardedUpdate,
    /// The engine changes the row itself as the guarded UPDATE would
    /// ([`SqlEngine::change_bucket_in_place`]): PostgreSQL with `pg_ratelimit.direct_writes`
    /// on, in a read committed, writable transaction; the guarded UPDATE still runs where
    /// the table's shape does not allow it.
    InPlace,
    /// The row locked FOR UPDATE, decided on, then compared and set: where the engine
    /// refuses guarded UPDATEs (Citus's distributed tables).
    LockAndCompare,
}

/// A store over an SQL engine.
pub struct SqlStore<E>(pub E);

fn bucket_of(row: Vec<Value>) -> BucketState {
    BucketState { level: row[0].as_f64(), refilled_at: row[1].as_i64(), full_at: row[2].as_i64() }
}

/// A guarded change done by hand on a row held FOR UPDATE: decide, then compare and set.
fn change_held<T: Copy>(
    row: Option<T>,
    decide: Decide<T>,
    replace: impl FnOnce(&T, &T) -> StoreResult<bool>,
) -> ChangeResult<T> {
    let Some(old) = row else { return Ok(Changed { decided_on: None, written: false }) };
    let written = match decide(&old) {
        None => false,
        Some(new) => replace(&new, &old)?,
    };
    Ok(Changed { decided_on: Some(old), written })
}

impl<E: SqlEngine> SqlStore<E> {
    /// The row at `at` read by `statement` (its kind's read or lock).
    fn row<A: RowAt>(&mut self, statement: Statement, at: A) -> StoreResult<Option<A::Row>> {
        let part = at.part();
        let row = self.0.query_row(statement, &[Value::Text(at.key()), Value::Text(&part)])?;
        Ok(row.map(|columns| A::Row::from_columns(&columns)))
    }

    /// Writes `new` over the bucket row of `key` if it still holds `old`.
    fn replace_bucket(&mut self, key: &str, old: &BucketState, new: &BucketState) -> StoreResult<bool> {
        let params = [
            Value::Float(new.level),
            Value::Int(new.refilled_at),
            Value::Int(new.full_at),
            Value::Text(key),
            Value::Float(old.level),
            Value::Int(old.refilled_at),
        ];
        Ok(self.0.execute(Statement::BucketUpdate, &params)? == 1)
    }

    fn bucket(&mut self, statement: Statement, key: &str) -> StoreResult<Option<BucketState>> {
        Ok(self.0.query_row(statement, &[Value::Text(key)])?.map(bucket_of))
    }
}

impl<E: SqlEngine> BucketRows for SqlStore<E> {
    fn buckets_read_only(&mut self) -> StoreResult<bool> {
        self.0.read_only()
    }

    fn read_bucket(&mut self, key: &str) -> StoreResult<Option<BucketState>> {
        self.bucket(Statement::BucketRead, key)
    }

    fn insert_bucket(&mut self, key: &str, row: &BucketState) -> StoreResult<bool> {
        let params = [Value::Text(key), Value::Float(row.level), Value::Int(row.refilled_at), Value::Int(row.full_at)];
        Ok(self.0.execute(Statement::BucketInsert, &params)? == 1)
    }

    fn change_bucket(&mut self, key: &str, decide: Decide<BucketState>) -> ChangeResult<BucketState> {
        match self.0.bucket_write()? {
            BucketWrite::LockAndCompare => {
                let row = self.bucket(Statement::BucketLock, key)?;
                return change_held(row, decide, |new, old| self.replace_bucket(key, old, new));
            }
            BucketWrite::InPlace => {
                if let Some(changed) = self.0.change_bucket_in_place(key, &decide) {
                    return changed;
                }
            }
            BucketWrite::GuardedUpdate => {}
        }
        let (written, decided_on) = decision_slot::with_decision(&decision_slot::BUCKET, decide, || {
            self.0.execute(Statement::BucketChange, &[Value::Text(key)])
        });
        Ok(Changed { decided_on, written: written? == 1 })
    }

    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        Ok(self.0.execute(Statement::SweepBuckets, &[Value::Int(cutoff_ms), Value::Int(limit)])? as i64)
    }

    /// Each row held by FOR UPDATE where rows are locked one by one (a missing row is first
    /// inserted as the row that answers like none, since it cannot be locked); elsewhere
    /// the unit's lock holds them. Writes compare and set, which fails only if a row
    /// changed while held.
    fn decide_buckets<R>(
        &mut self,
        items: &[&BucketItem],
        decide: impl FnOnce(&[Option<BucketState>]) -> (Vec<Option<BucketState>>, R),
    ) -> StoreResult<R> {
        let mut rows = Vec::with_capacity(items.len());
        for item in items {
            if E::LOCKS_ROWS {
                self.insert_bucket(item.key, &bucket::untouched(&item.limits))?;
            }
            rows.push(
                self.bucket(if E::LOCKS_ROWS { Statement::BucketLock } else { Statement::BucketRead }, item.key)?,
            );
        }
        let (writes, answer) = decide(&rows);
        for ((item, old), new) in items.iter().zip(&rows).zip(&writes) {
            let written = match (old, new) {
                (_, None) => true,
                (None, Some(new)) => self.insert_bucket(item.key, new)?,
                (Some(old), Some(new)) => self.replace_bucket(item.key, old, new)?,
            };
            if !written {
                return Err(StoreError { message: "a row changed while this call held it".into(), engine_code: None });
            }
        }
        Ok(answer)
    }

    /// At an epoch: where the engine keeps it in memory, rl_take's own guarded write once
    /// the epoch is found unmoved; else one that tests the epoch in its statement. Without
    /// one, a write that finds the policy at its revision and the subject without strikes.
    fn change_bucket_for_policy(
        &mut self,
        key: &str,
        guard: &PolicyGuard,
        decide: Decide<BucketState>,
    ) -> ChangeResult<BucketState> {
        let unwritten = Changed { decided_on: None, written: false };
        match self.epoch_unmoved_in_memory(guard) {
            Some(true) => return self.change_bucket(key, decide),
            Some(false) => return Ok(unwritten),
            None if !self.0.runs_guarded_updates()? => return Ok(unwritten),
            None => {}
        }
        let epoch_text;
        let (statement, params) = match guard.epoch {
            Some(epoch) => {
                epoch_text = (epoch as i64).to_string();
                (Statement::BucketChangeInEpoch, vec![Value::Text(key), Value::Text(&epoch_text)])
            }
            None => (
                Statement::BucketChangeForPolicy,
                vec![
                    Value::Text(key),
                    Value::Text(guard.subject),
                    Value::Int(guard.now_ms),
                    Value::Text(guard.policy),
                    Value::Int(guard.revision),
                ],
            ),
        };
        let (written, decided_on) =
            decision_slot::with_decision(&decision_slot::BUCKET, decide, || self.0.execute(statement, &params));
        Ok(Changed { decided_on, written: written? == 1 })
    }

    fn delete_bucket(&mut self, key: &str) -> StoreResult<i64> {
        Ok(self.0.execute(Statement::ResetBuckets, &[Value::Text(key)])? as i64)
    }
}

impl<E: SqlEngine> TableRows for SqlStore<E> {
    const LOCKS_ROWS: bool = E::LOCKS_ROWS;

    fn read_only(&mut self) -> StoreResult<bool> {
        self.0.read_only()
    }

    fn begin_unit(&mut self) -> StoreResult<bool> {
        self.0.begin_unit()
    }

    fn end_unit(&mut self, owned: bool, commit: bool) -> StoreResult<()> {
        self.0.end_unit(owned, commit)
    }

    fn change_budget(&mut self, key: &str, period: Period, decide: Decide<BudgetState>) -> ChangeResult<BudgetState> {
        let at = BudgetAt { key, period };
        if !self.0.runs_guarded_updates()? {
            let row = self.row(BudgetState::STATEMENTS.lock, at)?;
            return change_held(row, decide, |new, old| self.replace_row(at, old, new));
        }
        let (written, decided_on) = decision_slot::with_decision(&decision_slot::BUDGET, decide, || {
            self.0.execute(Statement::BudgetChange, &[Value::Text(key), Value::Text(&period.text())])
        });
        Ok(Changed { decided_on, written: written? == 1 })
    }

    fn read_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>> {
        self.row(A::Row::STATEMENTS.read, at)
    }

    fn insert_row<A: RowAt>(&mut self, at: A, row: &A::Row) -> StoreResult<bool> {
        let part = at.part();
        let mut params = vec![Value::Text(at.key()), Value::Text(&part)];
        params.extend(row.columns());
        Ok(self.0.execute(A::Row::STATEMENTS.insert, &params)? == 1)
    }

    fn hold_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>> {
        let statements = A::Row::STATEMENTS;
        self.row(if E::LOCKS_ROWS { statements.lock } else { statements.read }, at)
    }

    fn replace_row<A: RowAt>(&mut self, at: A, old: &A::Row, new: &A::Row) -> StoreResult<bool> {
        let part = at.part();
        let mut params = new.columns();
        params.extend([Value::Text(at.key()), Value::Text(&part)]);
        params.extend(old.columns());
        Ok(self.0.execute(A::Row::STATEMENTS.update, &params)? == 1)
    }

    fn sweep_rows<R: TableRow>(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        Ok(self.0.execute(R::STATEMENTS.sweep, &[Value::Int(cutoff_ms), Value::Int(limit)])? as i64)
    }

    fn delete_key(&mut self, key: &str) -> StoreResult<i64> {
        let mut removed = 0;
        for statement in [Statement::ResetBudgets, Statement::ResetEntries] {
            removed += self.0.execute(statement, &[Value::Text(key)])?;
        }
        Ok(removed as i64)
    }

    fn budgets_near(&mut self, fraction: f64, now_ms: i64, limit: i64) -> StoreResult<Vec<NearBudget>> {
        let params = [Value::Int(now_ms), Value::Float(fraction), Value::Int(limit)];
        let rows = self.0.query_rows(Statement::BudgetsNear, &params)?;
        Ok(rows
            .into_iter()
            .map(|r| NearBudget {
                key: r[0].as_text().to_owned(),
                period: r[1].as_text().to_owned(),
                used: r[2].as_i64(),
                quota: r[3].as_i64(),
                resets_at: r[4].as_i64(),
            })
            .collect())
    }

    fn keep_usage(&mut self, u: &UsagePeriod) -> StoreResult<()> {
        let params = [
            Value::Text(&u.key),
            Value::Text(&u.period),
            Value::Int(u.starts_at),
            Value::Int(u.ends_at),
            Value::Int(u.used),
            Value::Int(u.quota),
        ];
        self.0.execute(Statement::UsageKeep, &params)?;
        Ok(())
    }

    fn ended_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<Vec<(String, String, BudgetState)>> {
        let rows = self.0.query_rows(Statement::BudgetsEnded, &[Value::Int(cutoff_ms), Value::Int(limit)])?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let row = BudgetState { used: r[2].as_i64(), resets_at: r[3].as_i64(), quota: r[4].as_i64() };
                (r[0].as_text().to_owned(), r[1].as_text().to_owned(), row)
            })
            .collect())
    }

    fn read_setting(&mut self, name: &str) -> StoreResult<Option<i64>> {
        Ok(self.0.query_row(Statement::SettingRead, &[Value::Text(name)])?.map(|r| r[0].as_i64()))
    }

    fn write_setting(&mut self, name: &str, value: i64) -> StoreResult<()> {
        self.0.execute(Statement::SettingPut, &[Value::Text(name), Value::Int(value)])?;
        Ok(())
    }

    fn read_usage(&mut self, of: UsageOf, from_ms: i64, to_ms: i64, limit: i64) -> StoreResult<Vec<UsagePeriod>> {
        let rows = match of {
            UsageOf::Key(key) => {
                let params = [Value::Text(key), Value::Int(from_ms), Value::Int(to_ms), Value::Int(limit)];
                self.0.query_rows(Statement::UsageRead, &params)?
            }
            UsageOf::Every { after } => {
                // from the start: after (from_ms, "", ""), before every period that ended later
                let (ends_at, key, period) = after.map_or((from_ms, "", ""), |c| (c.ends_at, &c.key, &c.period));
                let params = [
                    Value::Int(from_ms),
                    Value::Int(to_ms),
                    Value::Int(ends_at),
                    Value::Text(key),
                    Value::Text(period),
                    Value::Int(limit),
                ];
                self.0.query_rows(Statement::UsagePage, &params)?
            }
        };
        Ok(rows
            .into_iter()
            .map(|r| UsagePeriod {
                key: r[0].as_text().to_owned(),
                period: r[1].as_text().to_owned(),
                starts_at: r[2].as_i64(),
                ends_at: r[3].as_i64(),
                used: r[4].as_i64(),
                quota: r[5].as_i64(),
            })
            .collect())
    }

    fn sweep_usage(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        Ok(self.0.execute(Statement::SweepUsage, &[Value::Int(cutoff_ms), Value::Int(limit)])? as i64)
    }

    fn read_policy(&mut self, name: &str) -> StoreResult<Option<StoredPolicy>> {
        Ok(self
            .0
            .query_row(Statement::PolicyRead, &[Value::Text(name)])?
            .map(|row| StoredPolicy { definition: row[0].as_text().to_owned(), revision: row[1].as_i64() }))
    }

    fn put_policy(&mut self, name: &str, definition: &str, revision: i64) -> StoreResult<()> {
        let params = [Value::Text(name), Value::Text(definition), Value::Int(revision)];
        self.0.execute(Statement::PolicyPut, &params)?;
        self.0.checks_changed()
    }

    fn delete_policy(&mut self, name: &str) -> StoreResult<bool> {
        let existed = self.0.execute(Statement::PolicyDelete, &[Value::Text(name)])? == 1;
        self.0.checks_changed()?;
        Ok(existed)
    }

    fn read_strike_rows(&mut self, limit: i64) -> StoreResult<Option<Vec<(String, String)>>> {
        let rows = self.0.query_rows(Statement::StrikeRowsRead, &[Value::Int(limit)])?;
        Ok(Some(rows.into_iter().map(|r| (r[0].as_text().to_owned(), r[1].as_text().to_owned())).collect()))
    }

    const CHECKS_EPOCH_IN_MEMORY: bool = E::CHECKS_EPOCH_IN_MEMORY;

    fn checks_epoch(&mut self) -> Option<u64> {
        self.0.checks_epoch()
    }

    fn checks_changed(&mut self) -> StoreResult<()> {
        self.0.checks_changed()
    }
}
