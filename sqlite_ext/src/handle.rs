//! The extension's own handle on a connection, kept for the connection's life so that
//! the statements it runs are prepared once, not on every call.
//!
//! Each statement is held in a slot of its own (the index of the core's `Statement`), so a
//! call finds it without rusqlite's statement cache, which hashes the statement's text
//! twice and copies it on every use (about 1,700 instructions of an `rl_take`).
//!
//! Prepared statements would make a plain sqlite3_close() fail ("unfinalized statements"),
//! so they are tied to an eponymous virtual table, `rl_statement_cache`: SQLite
//! disconnects virtual tables at the start of closing a connection, before it checks for
//! open statements, and disconnecting this one finalizes them.
//!
//! One of the two modules of this crate allowed `unsafe` (the workspace denies it
//! elsewhere; scalar.rs says why it needs it): SQLite's entry point, a second `Connection`
//! over the handle SQLite passes in, the statements held beside the `Connection` they
//! borrow, and the virtual table traits. Invariants: the handle stays valid for as long as
//! SQLite keeps the functions registered on it (they are dropped with the connection); the
//! `Connection` made from it never closes it (`from_handle` does not own the handle); a
//! held statement never outlives, nor leaves, the `Own` whose boxed `Connection` it
//! borrows (see `Own`).
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::ffi::{c_int, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use rusqlite::vtab::{
    sqlite3_vtab, sqlite3_vtab_cursor, Context, Filters, IndexInfo, Module, VTab, VTabConnection, VTabCursor,
};
use rusqlite::Connection;

const ANCHOR_TABLE: &CStr = c"rl_statement_cache";

/// Entry point; the name follows from the file name libratelimit.so.
///
/// # Safety
/// Called by SQLite with a valid connection and API table.
#[cfg(feature = "loadable")]
#[no_mangle]
pub unsafe extern "C" fn sqlite3_ratelimit_init(
    db: *mut rusqlite::ffi::sqlite3,
    pz_err_msg: *mut *mut std::ffi::c_char,
    p_api: *mut rusqlite::ffi::sqlite3_api_routines,
) -> c_int {
    Connection::extension_init2(db, pz_err_msg, p_api, crate::register_all)
}

/// The extension's own `Connection` over an application's connection (without the
/// loadable feature: SQLite linked into the application).
#[cfg(not(feature = "loadable"))]
pub fn alongside(conn: &Connection) -> rusqlite::Result<Connection> {
    // SAFETY: the handle is valid while `conn` is open; the functions registered on it are
    // dropped when that connection closes, and from_handle does not take ownership.
    unsafe { Connection::from_handle(conn.handle()) }
}

/// The connection and the statements prepared on it.
pub struct Own {
    /// Slot i holds statement i once prepared. Declared before `conn`, so dropped (and
    /// finalized) before it. The `'static` is not true: each borrows `*conn`, which is boxed
    /// (its address never changes) and outlives them; no statement is handed out but for
    /// the length of a closure that cannot keep it (`with_statement`).
    statements: Vec<Option<rusqlite::Statement<'static>>>,
    conn: Box<Connection>,
}

// SAFETY: a Statement is not Send only because it borrows its Connection, which is not
// Sync. Here the statements move with the one connection they borrow and are only used
// under the Handle's mutex, with it, so moving an `Own` is moving a Connection (Send).
unsafe impl Send for Own {}

impl Own {
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Runs `f` on the statement of `slot`, prepared from `text` the first time (a failed
    /// prepare is `Err(_, true)`, and nothing is held). `text` must be the same for a slot
    /// each time.
    pub fn with_statement<T>(
        &mut self,
        slot: usize,
        text: &str,
        f: impl FnOnce(&mut rusqlite::Statement<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, (rusqlite::Error, bool)> {
        if self.statements.len() <= slot {
            self.statements.resize_with(slot + 1, || None);
        }
        if self.statements[slot].is_none() {
            // SAFETY: see the field `statements`: the statement is dropped before the
            // boxed connection, and never leaves this struct.
            let conn: &'static Connection = unsafe { &*std::ptr::from_ref::<Connection>(&self.conn) };
            let prepared = conn.prepare_with_flags(text, rusqlite::PrepFlags::SQLITE_PREPARE_PERSISTENT);
            self.statements[slot] = Some(prepared.map_err(|e| (e, true))?);
        }
        match &mut self.statements[slot] {
            Some(stmt) => f(stmt).map_err(|e| (e, false)),
            None => unreachable!("prepared above"),
        }
    }

    /// Finalizes every held statement (and rusqlite's cache): before the connection
    /// closes, and before the schema is created or changed.
    pub fn finalize_statements(&mut self) {
        self.statements.clear();
        self.conn.flush_prepared_statement_cache();
    }
}

/// Shared by every function registered on one connection.
pub struct Handle {
    own: Mutex<Own>,
    /// Whether the anchor table is connected, so that closing finalizes the cache.
    anchored: AtomicBool,
}

impl Handle {
    /// The handle on the connection SQLite passed to the entry point, with the anchor table
    /// registered on it.
    pub fn new(db: Connection) -> rusqlite::Result<Arc<Handle>> {
        // SAFETY: the same connection SQLite just handed over; this Connection never closes it.
        let own = unsafe { Connection::from_handle(db.handle())? };
        let own = Own { statements: Vec::new(), conn: Box::new(own) };
        let handle = Arc::new(Handle { own: Mutex::new(own), anchored: AtomicBool::new(false) });
        db.create_module(ANCHOR_TABLE, &ANCHOR_MODULE, Some(handle.clone()))?;
        Ok(handle)
    }

    /// The connection, with its statement cache, for the length of one call. SQLite runs
    /// one statement of a connection at a time (the connection's own mutex, or the
    /// application's promise in multi-thread mode), so the lock is only ever held already
    /// when this call runs inside another on the same connection: a TEMP trigger on a state
    /// table calling an rl_* function (SQLite lets TEMP triggers call DIRECTONLY
    /// functions). Waiting would wait for itself forever, so that call is refused. (No
    /// thread id is asked for: std's current-thread handle leaves a destructor in this
    /// library that runs at thread exit, after SQLite may have unloaded it.)
    pub fn lock(&self, function: &str) -> rusqlite::Result<MutexGuard<'_, Own>> {
        let own = match self.own.try_lock() {
            Ok(own) => own,
            // A panic inside a call is caught at the FFI boundary; the connection stays usable.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
                    // The call this one runs inside reports it, prefixed with its own name.
                    Some(format!(
                        "{function} cannot run inside another rate-limit call on the same connection \
                         (a trigger on the extension's tables calls it)"
                    )),
                ));
            }
        };
        if !self.anchored.load(Ordering::Acquire) {
            own.conn.execute_batch("SELECT * FROM rl_statement_cache")?;
            self.anchored.store(true, Ordering::Release);
        }
        Ok(own)
    }

    /// The connection without anchoring: for registering functions during load.
    pub fn lock_unanchored(&self) -> MutexGuard<'_, Own> {
        self.own.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn finalize_statements(&self) {
        self.anchored.store(false, Ordering::Release);
        self.own.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).finalize_statements();
    }
}

const ANCHOR_MODULE: Module<'static, Anchor> = Module::eponymous_only_module();

/// An empty table whose only job is its disconnect.
#[repr(C)]
pub struct Anchor {
    base: sqlite3_vtab,
    handle: Arc<Handle>,
}

impl Drop for Anchor {
    fn drop(&mut self) {
        self.handle.finalize_statements();
    }
}

unsafe impl<'vtab> VTab<'vtab> for Anchor {
    type Aux = Arc<Handle>;
    type Cursor = EmptyCursor<'vtab>;

    fn connect(
        _db: &mut VTabConnection,
        aux: Option<&Arc<Handle>>,
        _module: &[u8],
        _database: &[u8],
        _table: &[u8],
        _args: &[&[u8]],
    ) -> rusqlite::Result<(Cow<'static, CStr>, Self)> {
        let handle =
            aux.cloned().ok_or_else(|| rusqlite::Error::ModuleError("rl_statement_cache: no handle".into()))?;
        Ok((Cow::Borrowed(c"CREATE TABLE x(statements)"), Anchor { base: sqlite3_vtab::default(), handle }))
    }

    fn best_index(&self, info: &mut IndexInfo) -> rusqlite::Result<bool> {
        info.set_estimated_cost(1.0);
        Ok(true)
    }

    fn open(&'vtab mut self) -> rusqlite::Result<EmptyCursor<'vtab>> {
        Ok(EmptyCursor { base: sqlite3_vtab_cursor::default(), phantom: PhantomData })
    }
}

#[repr(C)]
pub struct EmptyCursor<'vtab> {
    base: sqlite3_vtab_cursor,
    phantom: PhantomData<&'vtab Anchor>,
}

unsafe impl VTabCursor for EmptyCursor<'_> {
    fn filter(&mut self, _idx_num: c_int, _idx_str: Option<&str>, _args: &Filters<'_>) -> rusqlite::Result<()> {
        Ok(())
    }
    fn next(&mut self) -> rusqlite::Result<()> {
        Ok(())
    }
    fn eof(&self) -> bool {
        true
    }
    fn column(&self, _ctx: &mut Context, _i: c_int) -> rusqlite::Result<()> {
        Ok(())
    }
    fn rowid(&self) -> rusqlite::Result<i64> {
        Ok(0)
    }
}
