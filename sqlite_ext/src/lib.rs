//! SQLite loadable extension: registers the rl_* functions on each connection that loads
//! it. Glue only: convert values, run the core's statements on the caller's connection,
//! return the core's answer as JSON text. Every rule lives in `ratelimit_core`.

use std::os::raw::{c_char, c_int};

use ratelimit_core::bucket::BucketState;
use ratelimit_core::budget::{BudgetState, Period};
use ratelimit_core::{calls, sql, Arg, Clock, ErrorKind, StateStore, StoreError, StoreResult};
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::ValueRef;
use rusqlite::{ffi, named_params, Connection, OptionalExtension, MAIN_DB};

/// Functions that read or write state: never callable from views, triggers or schema of
/// an untrusted database file, never assumed to give the same answer twice.
const STATEFUL: FunctionFlags = FunctionFlags::SQLITE_UTF8.union(FunctionFlags::SQLITE_DIRECTONLY);
/// Pure functions: safe anywhere.
const PURE: FunctionFlags = FunctionFlags::SQLITE_UTF8
    .union(FunctionFlags::SQLITE_DETERMINISTIC)
    .union(FunctionFlags::SQLITE_INNOCUOUS);

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
    register_stateful(&db, calls::RL_TAKE, |s, a, c| calls::rl_take(s, a, c).map(|v| v.to_string()))?;
    register_stateful(&db, calls::RL_SPEND, |s, a, c| calls::rl_spend(s, a, c).map(|v| v.to_string()))?;
    register_stateful(&db, calls::RL_BUDGET, |s, a, c| calls::rl_budget(s, a, c).map(|v| v.to_string()))?;
    register_stateful(&db, calls::RL_SWEEP, |s, a, c| calls::rl_sweep(s, a, c))?;
    register_stateful(&db, calls::RL_PEEK, |s, a, c| calls::rl_peek(s, a, c).map(|v| v.to_string()))?;
    register_stateful(&db, calls::RL_REFUND, |s, a, c| calls::rl_refund(s, a, c).map(|v| v.to_string()))?;
    register_stateful(&db, calls::RL_REFUND_BUDGET, |s, a, c| calls::rl_refund_budget(s, a, c).map(|v| v.to_string()))?;
    register_stateful(&db, calls::RL_RESET, |s, a, _| calls::rl_reset(s, a))?;
    register_stateful(&db, calls::RL_TAKE_ALL, |s, a, c| calls::rl_take_all(s, a, c).map(|v| v.to_string()))?;
    db.create_scalar_function("rl_key", -1, PURE, |ctx| calls::rl_key(&args_of(ctx)).map_err(to_sqlite_error))?;
    db.create_scalar_function("rl_headers", -1, PURE, |ctx| {
        calls::rl_headers(&args_of(ctx)).map(|v| v.to_string()).map_err(to_sqlite_error)
    })?;
    Ok(false)
}

/// Registers a function that runs a core call on the caller's own connection. SQLite has
/// no clock policy of its own: an explicit now_ms is always allowed.
fn register_stateful<T: rusqlite::functions::SqlFnOutput + 'static>(
    db: &Connection,
    name: &'static str,
    call: fn(&mut SqliteStore<'_>, &[Arg<'_>], &Clock) -> ratelimit_core::Result<T>,
) -> rusqlite::Result<()> {
    db.create_scalar_function(name, -1, STATEFUL, move |ctx| {
        // SAFETY: the connection is only used during this call, on this thread.
        let conn = unsafe { ctx.get_connection()? };
        let mut store = SqliteStore { conn: &conn };
        call(&mut store, &args_of(ctx), &Clock::system(true)).map_err(to_sqlite_error)
    })
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

    /// Prepares a statement, creating the state tables first if they do not exist yet.
    fn prepare(&self, text: &str) -> StoreResult<rusqlite::CachedStatement<'_>> {
        match self.conn.prepare_cached(text) {
            Err(e) if e.to_string().contains("no such table") => {
                self.conn.execute_batch(sql::SQLITE_SCHEMA).map_err(|e| self.fail(e))?;
                self.conn.prepare_cached(text).map_err(|e| self.fail(e))
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
        self.prepare(sql::BUCKET_READ)?
            .query_row(named_params! {"$1": key}, |r| {
                Ok(BucketState { level: r.get(0)?, refilled_at: r.get(1)?, full_at: r.get(2)? })
            })
            .optional()
            .map_err(|e| self.fail(e))
    }

    fn write_bucket(&mut self, key: &str, expected: Option<&BucketState>, new: &BucketState) -> StoreResult<bool> {
        let changed = match expected {
            None => self.prepare(sql::BUCKET_INSERT)?.execute(named_params! {
                "$1": key, "$2": new.level, "$3": new.refilled_at, "$4": new.full_at,
            }),
            Some(old) => self.prepare(sql::BUCKET_UPDATE)?.execute(named_params! {
                "$1": key, "$2": new.level, "$3": new.refilled_at, "$4": new.full_at,
                "$5": old.level, "$6": old.refilled_at,
            }),
        };
        changed.map(|n| n == 1).map_err(|e| self.fail(e))
    }

    fn read_budget(&mut self, key: &str, period: Period, _lock: bool) -> StoreResult<Option<BudgetState>> {
        self.prepare(sql::BUDGET_READ)?
            .query_row(named_params! {"$1": key, "$2": period.as_str()}, |r| {
                Ok(BudgetState { used: r.get(0)?, resets_at: r.get(1)? })
            })
            .optional()
            .map_err(|e| self.fail(e))
    }

    fn write_budget(&mut self, key: &str, period: Period, expected: Option<&BudgetState>, new: &BudgetState) -> StoreResult<bool> {
        let changed = match expected {
            None => self.prepare(sql::BUDGET_INSERT)?.execute(named_params! {
                "$1": key, "$2": period.as_str(), "$3": new.used, "$4": new.resets_at,
            }),
            Some(old) => self.prepare(sql::BUDGET_UPDATE)?.execute(named_params! {
                "$1": key, "$2": period.as_str(), "$3": new.used, "$4": new.resets_at,
                "$5": old.used, "$6": old.resets_at,
            }),
        };
        changed.map(|n| n == 1).map_err(|e| self.fail(e))
    }

    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        let rows = self.prepare(sql::SWEEP_BUCKETS)?.execute(named_params! {"$1": cutoff_ms, "$2": limit});
        rows.map(|n| n as i64).map_err(|e| self.fail(e))
    }

    fn sweep_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        let rows = self.prepare(sql::SWEEP_BUDGETS)?.execute(named_params! {"$1": cutoff_ms, "$2": limit});
        rows.map(|n| n as i64).map_err(|e| self.fail(e))
    }

    fn reset(&mut self, key: &str) -> StoreResult<i64> {
        let buckets = self.prepare(sql::RESET_BUCKETS)?.execute(named_params! {"$1": key}).map_err(|e| self.fail(e))?;
        let budgets = self.prepare(sql::RESET_BUDGETS)?.execute(named_params! {"$1": key}).map_err(|e| self.fail(e))?;
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
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| self.fail(e))?;
        Ok(true)
    }

    fn end_atomic(&mut self, owned: bool, commit: bool) -> StoreResult<()> {
        if owned {
            self.conn.execute_batch(if commit { "COMMIT" } else { "ROLLBACK" }).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }
}
