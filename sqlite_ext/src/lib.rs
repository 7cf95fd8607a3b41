//! SQLite loadable extension: registers every function of the core's table
//! ([`ratelimit_core::functions`]) on each connection that loads it. Glue only: convert
//! values, run the core's statements on the caller's connection, return the core's answer.

mod handle;
mod scalar;

use std::sync::{Arc, LazyLock};

use handle::Handle;
use ratelimit_core::functions::{self, Entry, Function};
use ratelimit_core::sql::{self, Statement, Value};
use ratelimit_core::sql_store::{SqlEngine, SqlStore};
use ratelimit_core::{calls, Arg, Clock, ErrorKind, StoreError, StoreResult};
use rusqlite::functions::FunctionFlags;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{ffi, Connection, MAIN_DB};

/// Functions that read or write state, and the internal ones: never callable from views,
/// triggers or schema of an untrusted database file, never assumed to give the same
/// answer twice (so SQLite evaluates them for each row, in order).
const STATEFUL: FunctionFlags = FunctionFlags::SQLITE_UTF8.union(FunctionFlags::SQLITE_DIRECTONLY);
/// Reads this process's counters: no database state, no side effect, but not the same
/// answer twice.
const READS_PROCESS: FunctionFlags = FunctionFlags::SQLITE_UTF8.union(FunctionFlags::SQLITE_INNOCUOUS);
/// Pure functions: safe anywhere.
const PURE: FunctionFlags =
    FunctionFlags::SQLITE_UTF8.union(FunctionFlags::SQLITE_DETERMINISTIC).union(FunctionFlags::SQLITE_INNOCUOUS);

#[cfg(feature = "loadable")]
pub use handle::sqlite3_ratelimit_init;

/// Registers every function on an application's own connection (SQLite linked into the
/// application; this crate built with `default-features = false`): the same functions,
/// answers and errors as the loadable extension, no `.load` needed.
#[cfg(not(feature = "loadable"))]
pub fn register(conn: &Connection) -> rusqlite::Result<()> {
    register_all(handle::alongside(conn)?).map(|_| ())
}

/// Registers every function on the connection that loads the extension.
fn register_all(db: Connection) -> rusqlite::Result<bool> {
    let h = Handle::new(db)?;
    for f in functions::ALL {
        match f.entry {
            Entry::State(_) => register_stateful(&h, f)?,
            Entry::Pure(_) => register_without_store(&h, f, PURE)?,
            Entry::Internal(_) => register_without_store(&h, f, STATEFUL)?,
            // Counts of this process: a view may read them; resetting them is a call's own act.
            Entry::Process(_) if f.returns == functions::SqlType::Jsonb => {
                register_without_store(&h, f, READS_PROCESS)?
            }
            Entry::Process(_) => register_without_store(&h, f, STATEFUL)?,
            // The database file is the state every connection shares: no server memory.
            Entry::Server(_) => {}
        }
    }
    Ok(false)
}

/// A function that runs on the caller's own connection. SQLite has no clock policy of its
/// own: an explicit now_ms is always allowed.
fn register_stateful(h: &Arc<Handle>, f: &'static Function) -> rusqlite::Result<()> {
    let handle = h.clone();
    let body = move |args: &[Arg]| {
        let mut own = handle.lock(f.name)?;
        let mut store = SqlStore(SqliteEngine { own: &mut own });
        calls::call(f, &mut store, args, &Clock::system(true)).map_err(to_sqlite_error)
    };
    scalar::create(h.lock_unanchored().conn(), f.name, STATEFUL, Box::new(body))
}

/// A pure or internal function: it never touches the connection.
fn register_without_store(h: &Arc<Handle>, f: &'static Function, flags: FunctionFlags) -> rusqlite::Result<()> {
    let body = move |args: &[Arg]| calls::call_without_store(f, args).map_err(to_sqlite_error);
    scalar::create(h.lock_unanchored().conn(), f.name, flags, Box::new(body))
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
static SQLITE_TEXT: LazyLock<Vec<String>> =
    LazyLock::new(|| Statement::ALL.iter().map(|s| sql::sqlite(s.text())).collect());

/// A value bound to a statement, borrowed.
struct Bind<'a>(&'a Value<'a>);

impl ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Text(t) => ValueRef::Text(t.as_bytes()),
            Value::String(t) => ValueRef::Text(t.as_bytes()),
            Value::Float(f) => ValueRef::Real(*f),
            Value::Int(i) => ValueRef::Integer(*i),
        }))
    }
}

/// A result row read by the core's column types.
struct Columns<'r, 's>(&'r rusqlite::Row<'s>);

impl sql::RowColumns for Columns<'_, '_> {
    type Error = rusqlite::Error;

    fn real(&self, i: usize) -> rusqlite::Result<f64> {
        self.0.get(i)
    }

    fn text(&self, i: usize) -> rusqlite::Result<String> {
        self.0.get(i)
    }

    fn integer(&self, i: usize) -> rusqlite::Result<i64> {
        self.0.get(i)
    }
}

struct SqliteEngine<'c> {
    own: &'c mut handle::Own,
}

/// The slots of the statements that are not the core's, after the core's.
const BEGIN_IMMEDIATE: usize = Statement::ALL.len();
const COMMIT: usize = BEGIN_IMMEDIATE + 1;
const ROLLBACK: usize = BEGIN_IMMEDIATE + 2;

impl SqliteEngine<'_> {
    fn conn(&self) -> &Connection {
        self.own.conn()
    }

    fn fail(&self, e: rusqlite::Error) -> StoreError {
        let engine_code = e.sqlite_error().map(|f| f.extended_code);
        // A connection under PRAGMA query_only reads as writable (sqlite3_db_readonly) and
        // only its write fails: the same words as a database opened read-only. The extended
        // codes (a moved file, a journal it cannot roll back) keep SQLite's own.
        let mut message = if engine_code == Some(ffi::SQLITE_READONLY) {
            ratelimit_core::messages::READ_ONLY.template.to_owned()
        } else {
            e.to_string()
        };
        // SQLite's own code goes to the caller (scalar.rs), with what it means here
        message.push_str(match engine_code.map(|c| c & 0xff) {
            // A statement or transaction that read the database before the call holds a read
            // lock; SQLite cannot wait for the write lock then (it could deadlock) and fails
            // at once, whatever the busy timeout. A bare call only fails once the timeout ends.
            Some(ffi::SQLITE_BUSY) => {
                " (busy timeout ran out, or the calling statement or transaction had read the database first: \
                 run such calls inside BEGIN IMMEDIATE ... COMMIT)"
            }
            Some(ffi::SQLITE_LOCKED) => " (a connection sharing this cache holds the table: retry once it commits)",
            Some(ffi::SQLITE_FULL) => " (no room for the database or its journal: this call wrote nothing)",
            _ => "",
        });
        StoreError { engine_code, message }
    }

    /// Runs one statement, prepared once per connection and held in its slot. When the state tables are missing
    /// (never created, dropped, or created in a transaction that rolled back) it creates
    /// them and runs the statement once more; but a read-only database, which cannot have
    /// them created, answers `read_only_without_tables` instead when there is one (a read
    /// of a database that never had state: no row).
    fn run<T>(
        &mut self,
        slot: usize,
        text: &str,
        read_only_without_tables: Option<T>,
        f: impl Fn(&mut rusqlite::Statement<'_>) -> rusqlite::Result<T>,
    ) -> StoreResult<T> {
        // the error, and whether it came from preparing the statement
        match self.own.with_statement(slot, text, &f) {
            // A missing table is SQLITE_ERROR like any other failed prepare: ask the schema
            // rather than read the message.
            Err((e, at_prepare)) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::Unknown) => {
                if self.has_state_tables()? {
                    // there now: another connection created them after this one's prepare
                    // failed; or made by an earlier version, which this one upgrades
                    if !at_prepare {
                        return Err(self.fail(e));
                    }
                    self.upgrade_schema()?;
                } else {
                    if let Some(answer) = read_only_without_tables {
                        if self.conn().is_readonly(MAIN_DB).map_err(|e| self.fail(e))? {
                            return Ok(answer);
                        }
                    }
                    self.own.finalize_statements();
                    self.conn().execute_batch(sql::SQLITE_SCHEMA).map_err(|e| self.fail(e))?;
                    // a database of 0.1.0 or 0.2.0 had rl_budget already, without its quota
                    self.upgrade_schema()?;
                }
                self.own.with_statement(slot, text, &f).map_err(|(e, _)| self.fail(e))
            }
            Err((e, _)) => Err(self.fail(e)),
            Ok(answer) => Ok(answer),
        }
    }

    /// Brings tables an earlier version made to this version's schema_version (3: the
    /// column rl_budget.quota, then the schema script's views), if they are not there yet.
    /// A read-only database keeps its layout (the statement's own error follows).
    fn upgrade_schema(&mut self) -> StoreResult<()> {
        let has_quota = |conn: &rusqlite::Connection| {
            conn.query_row(
                "SELECT count(*) FROM pragma_table_info('rl_budget', 'main') WHERE name = 'quota'",
                [],
                |r| r.get::<_, i64>(0),
            )
        };
        if has_quota(self.conn()).map_err(|e| self.fail(e))? == 1 || self.conn().is_readonly(MAIN_DB).unwrap_or(true) {
            return Ok(());
        }
        let added = self.conn().execute_batch("ALTER TABLE main.rl_budget ADD COLUMN quota INTEGER NOT NULL DEFAULT 0");
        // another connection may have added it between the two statements
        if let Err(e) = added {
            if has_quota(self.conn()).map_err(|e| self.fail(e))? != 1 {
                return Err(self.fail(e));
            }
        }
        self.own.finalize_statements();
        self.conn().execute_batch(sql::SQLITE_SCHEMA).map_err(|e| self.fail(e))
    }

    /// Whether every state table is in `main`.
    fn has_state_tables(&self) -> StoreResult<bool> {
        let found: i64 = self
            .conn()
            .prepare_cached(&STATE_TABLES_COUNT)
            .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
            .map_err(|e| self.fail(e))?;
        Ok(found == sql::TABLES.len() as i64)
    }
}

/// How many of the state tables `main` holds.
static STATE_TABLES_COUNT: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<String> = sql::TABLES.iter().map(|t| format!("'{t}'")).collect();
    format!("SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name IN ({})", names.join(", "))
});

fn bound<'a>(params: &'a [Value<'a>]) -> impl rusqlite::Params + 'a {
    rusqlite::params_from_iter(params.iter().map(Bind))
}

impl SqlEngine for SqliteEngine<'_> {
    const LOCKS_ROWS: bool = false;

    fn read_only(&mut self) -> StoreResult<bool> {
        self.conn().is_readonly(MAIN_DB).map_err(|e| self.fail(e))
    }

    fn execute(&mut self, statement: Statement, params: &[Value]) -> StoreResult<u64> {
        let slot = statement as usize;
        self.run(slot, &SQLITE_TEXT[slot], None, |stmt| stmt.execute(bound(params))).map(|n| n as u64)
    }

    fn query_row(&mut self, statement: Statement, params: &[Value]) -> StoreResult<Option<Vec<Value<'static>>>> {
        Ok(self.query_rows(statement, params)?.into_iter().next())
    }

    fn query_rows(&mut self, statement: Statement, params: &[Value]) -> StoreResult<Vec<Vec<Value<'static>>>> {
        let slot = statement as usize;
        self.run(slot, &SQLITE_TEXT[slot], Some(Vec::new()), |stmt| {
            stmt.query_map(bound(params), |r| sql::decode_row(statement, &Columns(r)))?.collect()
        })
    }

    /// A random number in rl_meta that the schema's triggers draw anew (None in a file
    /// without it, whose checks then test the policy and the subject in each statement).
    const CHECKS_EPOCH_IN_MEMORY: bool = false;

    fn checks_epoch(&mut self) -> Option<u64> {
        let row = self.query_row(Statement::ChecksEpochRead, &[]).ok()??;
        row[0].as_text().parse::<i64>().ok().map(|e| e as u64)
    }

    /// The triggers on rl_policy and rl_entries move the epoch, whoever writes the row.
    fn checks_changed(&mut self) -> StoreResult<()> {
        Ok(())
    }

    /// Outside a transaction each statement would commit (and drop the write lock) on its
    /// own, so a multi-row change takes the write lock first with BEGIN IMMEDIATE. Inside
    /// the caller's transaction the first write holds the lock until the caller commits.
    fn begin_unit(&mut self) -> StoreResult<bool> {
        if !self.conn().is_autocommit() {
            return Ok(false);
        }
        self.run(BEGIN_IMMEDIATE, "BEGIN IMMEDIATE", None, |stmt| stmt.execute([]))?;
        Ok(true)
    }

    fn end_unit(&mut self, owned: bool, commit: bool) -> StoreResult<()> {
        if owned {
            let (slot, text) = if commit { (COMMIT, "COMMIT") } else { (ROLLBACK, "ROLLBACK") };
            self.run(slot, text, None, |stmt| stmt.execute([]))?;
        }
        Ok(())
    }
}
