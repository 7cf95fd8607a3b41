//! SQLite loadable extension: registers the rl_* functions on each connection that loads
//! it. Glue only: convert values, run the core's statements on the caller's connection,
//! return the core's answer as JSON text. Every rule lives in `ratelimit_core`.

mod handle;

use std::os::raw::{c_char, c_int};
use std::sync::{Arc, LazyLock};

use handle::Handle;

use ratelimit_core::bucket::BucketState;
use ratelimit_core::budget::{BudgetState, Period};
use ratelimit_core::guard::{self, Change};
use ratelimit_core::sql::{self, Statement};
use ratelimit_core::{calls, Arg, Clock, ErrorKind, StateStore, StoreError, StoreResult};
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::ValueRef;
use rusqlite::{ffi, params, Connection, OptionalExtension, MAIN_DB};

/// Functions that read or write state: never callable from views, triggers or schema of
/// an untrusted database file, never assumed to give the same answer twice.
const STATEFUL: FunctionFlags = FunctionFlags::SQLITE_UTF8.union(FunctionFlags::SQLITE_DIRECTONLY);
/// Pure functions: safe anywhere.
const PURE: FunctionFlags =
    FunctionFlags::SQLITE_UTF8.union(FunctionFlags::SQLITE_DETERMINISTIC).union(FunctionFlags::SQLITE_INNOCUOUS);

/// Entry point; the name follows from the file name libratelimit.so.
///
/// # Safety
/// Called by SQLite with a valid connection and API table.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_ratelimit_init(
    db: *mut ffi::sqlite3,
    pz_err_msg: *mut *mut c_char,
    p_api: *mut ffi::sqlite3_api_routines,
) -> c_int {
    Connection::extension_init2(db, pz_err_msg, p_api, register)
}

fn register(db: Connection) -> rusqlite::Result<bool> {
    // SAFETY: the same connection SQLite just handed over; the handle never closes it.
    let own = unsafe { Connection::from_handle(db.handle())? };
    let h = Handle::new(own);
    db.create_module(handle::ANCHOR_TABLE, &handle::ANCHOR_MODULE, Some(h.clone()))?;
    let db = &h;
    register_stateful(db, calls::RL_TAKE, |s, a, c| calls::rl_take(s, a, c))?;
    register_stateful(db, calls::RL_SPEND, |s, a, c| calls::rl_spend(s, a, c))?;
    register_stateful(db, calls::RL_BUDGET, |s, a, c| calls::rl_budget(s, a, c))?;
    register_stateful(db, calls::RL_SWEEP, |s, a, c| calls::rl_sweep(s, a, c))?;
    register_stateful(db, calls::RL_PEEK, |s, a, c| calls::rl_peek(s, a, c))?;
    register_stateful(db, calls::RL_REFUND, |s, a, c| calls::rl_refund(s, a, c))?;
    register_stateful(db, calls::RL_REFUND_BUDGET, |s, a, c| calls::rl_refund_budget(s, a, c))?;
    register_stateful(db, calls::RL_RESET, |s, a, _| calls::rl_reset(s, a))?;
    register_stateful(db, calls::RL_TAKE_ALL, |s, a, c| calls::rl_take_all(s, a, c))?;
    let db = h.lock_unanchored();
    register_guards(&db)?;
    db.create_scalar_function("rl_key", -1, PURE, |ctx| calls::rl_key(&args_of(ctx)).map_err(to_sqlite_error))?;
    db.create_scalar_function("rl_headers", -1, PURE, |ctx| calls::rl_headers(&args_of(ctx)).map_err(to_sqlite_error))?;
    Ok(false)
}

/// Registers a function that runs a core call on the caller's own connection. SQLite has
/// no clock policy of its own: an explicit now_ms is always allowed.
fn register_stateful<T: rusqlite::functions::SqlFnOutput + 'static>(
    h: &Arc<Handle>,
    name: &'static str,
    call: fn(&mut SqliteStore<'_>, &[Arg<'_>], &Clock) -> ratelimit_core::Result<T>,
) -> rusqlite::Result<()> {
    let handle = h.clone();
    h.lock_unanchored().create_scalar_function(name, -1, STATEFUL, move |ctx| {
        let conn = handle.lock()?;
        let mut store = SqliteStore { conn: &conn };
        call(&mut store, &args_of(ctx), &Clock::system(true)).map_err(to_sqlite_error)
    })
}

/// The functions the guarded UPDATEs (sql/bucket_change.sql, sql/budget_change.sql) call:
/// the WHERE clause hands the row to the decision of the call in progress, the SET clause
/// reads the row it decided on. Outside those statements they fail. Not deterministic, so
/// that SQLite evaluates them for the row, in order.
fn register_guards(db: &Connection) -> rusqlite::Result<()> {
    fn outside(e: guard::NotInStatement) -> rusqlite::Error {
        rusqlite::Error::UserFunctionError(e.to_string().into())
    }
    db.create_scalar_function("rl_bucket_guard", 3, STATEFUL, |ctx| {
        let row = BucketState { level: ctx.get(0)?, refilled_at: ctx.get(1)?, full_at: ctx.get(2)? };
        guard::guard(&guard::BUCKET, &row).map_err(outside)
    })?;
    db.create_scalar_function("rl_bucket_new_level", 0, STATEFUL, |_| {
        Ok(guard::new_row(&guard::BUCKET).map_err(outside)?.level)
    })?;
    db.create_scalar_function("rl_bucket_new_refilled_at", 0, STATEFUL, |_| {
        Ok(guard::new_row(&guard::BUCKET).map_err(outside)?.refilled_at)
    })?;
    db.create_scalar_function("rl_bucket_new_full_at", 0, STATEFUL, |_| {
        Ok(guard::new_row(&guard::BUCKET).map_err(outside)?.full_at)
    })?;
    db.create_scalar_function("rl_budget_guard", 2, STATEFUL, |ctx| {
        let row = BudgetState { used: ctx.get(0)?, resets_at: ctx.get(1)? };
        guard::guard(&guard::BUDGET, &row).map_err(outside)
    })?;
    db.create_scalar_function("rl_budget_new_used", 0, STATEFUL, |_| {
        Ok(guard::new_row(&guard::BUDGET).map_err(outside)?.used)
    })?;
    db.create_scalar_function("rl_budget_new_resets_at", 0, STATEFUL, |_| {
        Ok(guard::new_row(&guard::BUDGET).map_err(outside)?.resets_at)
    })?;
    Ok(())
}

/// The arguments of a call as core values. Text that is not UTF-8 arrives as a blob.
fn args_of<'a>(ctx: &'a Context<'_>) -> Vec<Arg<'a>> {
    (0..ctx.len())
        .map(|i| match ctx.get_raw(i) {
            ValueRef::Null => Arg::Null,
            ValueRef::Integer(n) => Arg::Integer(n),
            ValueRef::Real(r) => Arg::Real(r),
            ValueRef::Text(t) => std::str::from_utf8(t).map_or(Arg::Blob(t), Arg::Text),
            ValueRef::Blob(b) => Arg::Blob(b),
        })
        .collect()
}

/// A core error as the SQLite error the caller sees: the core's text, and SQLite's own
/// code (e.g. SQLITE_BUSY) when a statement failed.
fn to_sqlite_error(e: ratelimit_core::Error) -> rusqlite::Error {
    let code = match (e.kind, e.engine_code) {
        (_, Some(code)) => code,
        (ErrorKind::ReadOnly, None) => ffi::SQLITE_READONLY,
        _ => ffi::SQLITE_ERROR,
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(e.to_string()))
}

/// Every statement in SQLite's form, derived once.
static SQLITE_TEXT: LazyLock<[String; Statement::ALL.len()]> =
    LazyLock::new(|| Statement::ALL.map(|s| sql::sqlite(s.text())));

fn text(statement: Statement) -> &'static str {
    &SQLITE_TEXT[statement as usize]
}

struct SqliteStore<'c> {
    conn: &'c Connection,
}

impl SqliteStore<'_> {
    fn fail(&self, e: rusqlite::Error) -> StoreError {
        let engine_code = e.sqlite_error().map(|f| f.extended_code);
        let mut message = e.to_string();
        if engine_code.is_some_and(|c| c & 0xff == ffi::SQLITE_BUSY) {
            // A statement or transaction that read the database before the call holds a read
            // lock; SQLite cannot wait for the write lock then (it could deadlock) and fails
            // at once, whatever the busy timeout. A bare call only fails once the timeout ends.
            message.push_str(
                " (busy timeout ran out, or the calling statement or transaction had read the database first: \
                 run such calls inside BEGIN IMMEDIATE ... COMMIT)",
            );
        }
        StoreError { engine_code, message }
    }

    /// Runs one statement, prepared once per connection. When the state tables are missing
    /// (never created, dropped, or created in a transaction that rolled back) it creates
    /// them and runs the statement once more.
    fn run<T>(
        &self,
        text: &str,
        f: impl Fn(&mut rusqlite::CachedStatement<'_>) -> rusqlite::Result<T>,
    ) -> StoreResult<T> {
        let attempt = || self.conn.prepare_cached(text).and_then(|mut stmt| f(&mut stmt));
        match attempt() {
            Err(e) if e.to_string().contains("no such table") => {
                self.conn.flush_prepared_statement_cache();
                self.conn.execute_batch(sql::SQLITE_SCHEMA).map_err(|e| self.fail(e))?;
                attempt().map_err(|e| self.fail(e))
            }
            other => other.map_err(|e| self.fail(e)),
        }
    }
}

impl StateStore for SqliteStore<'_> {
    fn read_only(&mut self) -> StoreResult<bool> {
        self.conn.is_readonly(MAIN_DB).map_err(|e| self.fail(e))
    }

    fn read_bucket(&mut self, key: &str, _lock: bool) -> StoreResult<Option<BucketState>> {
        self.run(text(Statement::BucketRead), |stmt| {
            stmt.query_row([key], |r| Ok(BucketState { level: r.get(0)?, refilled_at: r.get(1)?, full_at: r.get(2)? }))
                .optional()
        })
    }

    fn write_bucket(&mut self, key: &str, expected: Option<&BucketState>, new: &BucketState) -> StoreResult<bool> {
        let changed = match expected {
            None => self.run(text(Statement::BucketInsert), |stmt| {
                stmt.execute(params![key, new.level, new.refilled_at, new.full_at])
            })?,
            Some(old) => self.run(text(Statement::BucketUpdate), |stmt| {
                stmt.execute(params![new.level, new.refilled_at, new.full_at, key, old.level, old.refilled_at])
            })?,
        };
        Ok(changed == 1)
    }

    fn read_budget(&mut self, key: &str, period: Period, _lock: bool) -> StoreResult<Option<BudgetState>> {
        self.run(text(Statement::BudgetRead), |stmt| {
            stmt.query_row([key, period.as_str()], |r| Ok(BudgetState { used: r.get(0)?, resets_at: r.get(1)? }))
                .optional()
        })
    }

    fn write_budget(
        &mut self,
        key: &str,
        period: Period,
        expected: Option<&BudgetState>,
        new: &BudgetState,
    ) -> StoreResult<bool> {
        let changed = match expected {
            None => self.run(text(Statement::BudgetInsert), |stmt| {
                stmt.execute(params![key, period.as_str(), new.used, new.resets_at])
            })?,
            Some(old) => self.run(text(Statement::BudgetUpdate), |stmt| {
                stmt.execute(params![new.used, new.resets_at, key, period.as_str(), old.used, old.resets_at])
            })?,
        };
        Ok(changed == 1)
    }

    fn change_bucket(&mut self, key: &str, change: &mut Change<'_, BucketState>) -> StoreResult<u64> {
        guard::with_change(&guard::BUCKET, change, || {
            self.run(text(Statement::BucketChange), |stmt| stmt.execute([key]))
        })
        .map(|n| n as u64)
    }

    fn change_budget(&mut self, key: &str, period: Period, change: &mut Change<'_, BudgetState>) -> StoreResult<u64> {
        guard::with_change(&guard::BUDGET, change, || {
            self.run(text(Statement::BudgetChange), |stmt| stmt.execute([key, period.as_str()]))
        })
        .map(|n| n as u64)
    }

    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        self.run(text(Statement::SweepBuckets), |stmt| stmt.execute([cutoff_ms, limit])).map(|n| n as i64)
    }

    fn sweep_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        self.run(text(Statement::SweepBudgets), |stmt| stmt.execute([cutoff_ms, limit])).map(|n| n as i64)
    }

    fn reset(&mut self, key: &str) -> StoreResult<i64> {
        let buckets = self.run(text(Statement::ResetBuckets), |stmt| stmt.execute([key]))?;
        let budgets = self.run(text(Statement::ResetBudgets), |stmt| stmt.execute([key]))?;
        Ok((buckets + budgets) as i64)
    }

    fn has_row_locks(&self) -> bool {
        false
    }

    /// Outside a transaction each statement would commit (and drop the write lock) on its
    /// own, so a multi-row change takes the write lock first with BEGIN IMMEDIATE. Inside
    /// the caller's transaction the first write holds the lock until the caller commits.
    fn begin_atomic(&mut self) -> StoreResult<bool> {
        if !self.conn.is_autocommit() {
            return Ok(false);
        }
        self.run("BEGIN IMMEDIATE", |stmt| stmt.execute([]))?;
        Ok(true)
    }

    fn end_atomic(&mut self, owned: bool, commit: bool) -> StoreResult<()> {
        if owned {
            self.run(if commit { "COMMIT" } else { "ROLLBACK" }, |stmt| stmt.execute([]))?;
        }
        Ok(())
    }
}
