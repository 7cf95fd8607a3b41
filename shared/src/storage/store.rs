//! The seam between the rules and an engine: what an engine must do with state rows, split
//! by where the rows live ([`crate::protocol`] runs every call over a [`Store`]).
//!
//! - [`BucketRows`]: buckets, the only rows the memory store keeps elsewhere.
//! - [`TableRows`]: budgets, rows of entries (windows, leases, strikes), policies and the
//!   checks epoch, always in the engine's tables; and the units that make several changes
//!   one.
//!
//! Two ways to change a row. A single-row change (rl_take, rl_spend, the refunds) is one
//! guarded write: the engine hands the row it is about to change to the call's decision
//! and writes what that decision wants, in one step; a refusal writes nothing, and only a
//! missing row takes a second step, an insert that may lose to a concurrent one. Calls on
//! several rows (rl_take_all, rl_reset) and on rows of entries, whose decisions are too
//! large for a guarded write, run as one unit that reads each row holding it (PostgreSQL:
//! FOR UPDATE; SQLite: the write lock of BEGIN IMMEDIATE), decides, and writes each row
//! only if it still holds what was read.

use crate::bucket::BucketState;
use crate::budget::{BudgetState, NearBudget, UsageCursor, UsagePeriod};
use crate::decision_slot::Decide;
use crate::sql::{RowStatements, Statement, Value};
use crate::take_all::BucketItem;
use crate::units::Period;

/// A statement that failed in the engine: its message, and the engine's own error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub message: String,
    pub engine_code: Option<i32>,
}

pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// A failed statement, reported as a Storage error (with the engine's code) by the call it
/// happened in.
impl From<StoreError> for crate::error::Error {
    fn from(e: StoreError) -> Self {
        let mut error = crate::error::Error::storage(e.message);
        error.engine_code = e.engine_code;
        error
    }
}

/// Whose kept periods a read lists: one key's (rl_usage), or every key's after a place in
/// the order (a page of rl_usage_all; None: from the start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageOf<'a> {
    Key(&'a str),
    Every { after: Option<&'a UsageCursor> },
}

/// What a guarded write did: the row it last decided on (None: there was no row), and
/// whether it wrote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Changed<T> {
    pub decided_on: Option<T>,
    pub written: bool,
}

/// What [`BucketRows::change_bucket`] and [`TableRows::change_budget`] return.
pub type ChangeResult<T> = StoreResult<Changed<T>>;

/// Which kind of row a call changes: the two may live in different homes (PostgreSQL's
/// memory store keeps buckets in shared memory, budgets in their tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    Buckets,
    Budgets,
    Entries,
    Policies,
}

/// Which list a row of entries holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// A sliding window's admissions ([`crate::window`]).
    Window,
    /// A fixed window's admissions, one entry per window ([`crate::window`]).
    FixedWindow,
    /// A concurrency cap's leases ([`crate::lease`]).
    Lease,
    /// A subject's strikes and block ([`crate::penalty`]).
    Block,
}

impl EntryKind {
    /// The name stored in the kind column.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Window => "window",
            EntryKind::FixedWindow => "fixed_window",
            EntryKind::Lease => "lease",
            EntryKind::Block => "block",
        }
    }
}

/// A row of entries as stored: the list as text (its kind's encoding), and when the last
/// entry stops counting (the sweep removes the row from then on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntriesRow {
    pub entries: String,
    pub empty_at: i64,
}

/// A policy as stored: its definition and the revision every rl_policy_set gives it anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPolicy {
    pub definition: String,
    pub revision: i64,
}

/// A kind of row the tables hold (a budget, a row of entries): stored under its key and a
/// second part of its primary key, as columns of its own (a budget's three, entries' two).
pub trait TableRow: Clone + PartialEq + 'static {
    /// Which rows these are (for the read-only test).
    const ROWS: Rows;
    /// The statements an SQL store reads and writes them with.
    const STATEMENTS: &'static RowStatements;
    /// When the row stops changing any answer: the sweep may delete it from then on.
    fn ends_at(&self) -> i64;
    /// Its columns, in the order the statements bind and read them.
    fn columns(&self) -> Vec<Value<'_>>;
    /// The row from its columns as read.
    fn from_columns(columns: &[Value]) -> Self;
}

/// Where a row of the tables lives: what a read, hold, insert or replace addresses.
pub trait RowAt: Copy {
    type Row: TableRow;
    fn key(&self) -> &str;
    /// The second part of the primary key, as stored (a budget's period, an entries kind).
    fn part(&self) -> std::borrow::Cow<'static, str>;
}

/// The budget row of `key` for `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetAt<'a> {
    pub key: &'a str,
    pub period: Period,
}

/// The row of entries of `kind` under `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntriesAt<'a> {
    pub kind: EntryKind,
    pub key: &'a str,
}

impl RowAt for BudgetAt<'_> {
    type Row = BudgetState;
    fn key(&self) -> &str {
        self.key
    }
    fn part(&self) -> std::borrow::Cow<'static, str> {
        self.period.text()
    }
}

impl RowAt for EntriesAt<'_> {
    type Row = EntriesRow;
    fn key(&self) -> &str {
        self.key
    }
    fn part(&self) -> std::borrow::Cow<'static, str> {
        self.kind.as_str().into()
    }
}

impl TableRow for BudgetState {
    const ROWS: Rows = Rows::Budgets;
    const STATEMENTS: &'static RowStatements = &RowStatements {
        read: Statement::BudgetRead,
        lock: Statement::BudgetLock,
        insert: Statement::BudgetInsert,
        update: Statement::BudgetUpdate,
        sweep: Statement::SweepBudgets,
    };
    /// A period's use stops counting when the period ends.
    fn ends_at(&self) -> i64 {
        self.resets_at
    }
    fn columns(&self) -> Vec<Value<'_>> {
        vec![Value::Int(self.used), Value::Int(self.resets_at), Value::Int(self.quota)]
    }
    fn from_columns(columns: &[Value]) -> Self {
        BudgetState { used: columns[0].as_i64(), resets_at: columns[1].as_i64(), quota: columns[2].as_i64() }
    }
}

impl TableRow for EntriesRow {
    const ROWS: Rows = Rows::Entries;
    const STATEMENTS: &'static RowStatements = &RowStatements {
        read: Statement::EntriesRead,
        lock: Statement::EntriesLock,
        insert: Statement::EntriesInsert,
        update: Statement::EntriesUpdate,
        sweep: Statement::SweepEntries,
    };
    fn ends_at(&self) -> i64 {
        self.empty_at
    }
    fn columns(&self) -> Vec<Value<'_>> {
        vec![Value::Text(&self.entries), Value::Int(self.empty_at)]
    }
    fn from_columns(columns: &[Value]) -> Self {
        EntriesRow { entries: columns[0].as_text().to_owned(), empty_at: columns[1].as_i64() }
    }
}

/// What rl_check's one-statement path must still find true when it writes
/// ([`BucketRows::change_bucket_for_policy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyGuard<'a> {
    pub policy: &'a str,
    /// The revision the caller decided with.
    pub revision: i64,
    pub subject: &'a str,
    pub now_ms: i64,
    /// The checks epoch at which the caller read the policy at `revision` and knew the
    /// subject had no recorded block: the write needs only the epoch unmoved. None: the
    /// write finds the revision current and the subject without strikes or block itself.
    pub epoch: Option<u64>,
}

/// What buckets need, wherever they live: the one part of the store the memory store
/// replaces (PostgreSQL's shared memory). A change is one guarded write.
pub trait BucketRows {
    /// Whether buckets cannot be written here (a read-only database or transaction).
    fn buckets_read_only(&mut self) -> StoreResult<bool>;
    /// The bucket row of `key`, as it stands (no lock).
    fn read_bucket(&mut self, key: &str) -> StoreResult<Option<BucketState>>;
    /// Inserts the bucket row of `key` unless one exists; returns whether it did.
    fn insert_bucket(&mut self, key: &str, row: &BucketState) -> StoreResult<bool>;
    /// One guarded write of the bucket row of `key`: calls `decide` with the row as it
    /// stands when the write reaches it (again, if a concurrent write makes it re-check a
    /// newer version) and stores what the last call returned, if anything. `decide` is
    /// never called when there is no row.
    fn change_bucket(&mut self, key: &str, decide: Decide<BucketState>) -> ChangeResult<BucketState>;
    /// Deletes at most `limit` buckets that are full by `cutoff_ms`, re-checking `full_at`
    /// on the row it deletes, so a row a concurrent take just refilled stays.
    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// Holds the bucket rows of `items` (in this order, keys all different), hands them to
    /// `decide` and, still holding them, stores each row it returns (Some) in the same
    /// order. Returns what `decide` answered alongside.
    fn decide_buckets<R>(
        &mut self,
        items: &[&BucketItem],
        decide: impl FnOnce(&[Option<BucketState>]) -> (Vec<Option<BucketState>>, R),
    ) -> StoreResult<R>;
    /// Deletes the bucket of `key`; returns how many rows went.
    fn delete_bucket(&mut self, key: &str) -> StoreResult<i64>;
    /// [`BucketRows::change_bucket`], only while `guard` holds; otherwise, or where the
    /// store cannot test it, it writes nothing and reports no row (this default), and
    /// rl_check takes its general path.
    fn change_bucket_for_policy(
        &mut self,
        _key: &str,
        _guard: &PolicyGuard,
        _decide: Decide<BucketState>,
    ) -> ChangeResult<BucketState> {
        Ok(Changed { decided_on: None, written: false })
    }
}

/// What the tables hold: rows of two kinds ([`TableRow`]: budgets, changed by one guarded
/// write like buckets, and rows of entries (windows, leases, strikes), read, held and
/// replaced in one unit), each operation written once over the kind; policies and the
/// checks epoch; and the units that make several changes one.
pub trait TableRows {
    /// Whether a held row is locked by itself (PostgreSQL), which a missing row cannot be,
    /// rather than by a lock on the whole database (SQLite).
    const LOCKS_ROWS: bool;
    /// Whether the tables refuse writes (a read-only database or transaction).
    fn read_only(&mut self) -> StoreResult<bool>;
    /// Makes the following statements one unit that holds the write lock from its start,
    /// unless the caller's own transaction already is one. Returns whether it began one.
    fn begin_unit(&mut self) -> StoreResult<bool>;
    /// Ends what [`TableRows::begin_unit`] began (`owned`): commit, or roll back.
    fn end_unit(&mut self, owned: bool, commit: bool) -> StoreResult<()>;

    /// [`BucketRows::change_bucket`] for the budget row of `key` and `period` (the one
    /// table row a single guarded write changes).
    fn change_budget(&mut self, key: &str, period: Period, d: Decide<BudgetState>) -> ChangeResult<BudgetState>;

    /// The row at `at`, as it stands (no lock).
    fn read_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>>;
    /// Inserts `row` at `at` unless a row is there; returns whether it did.
    fn insert_row<A: RowAt>(&mut self, at: A, row: &A::Row) -> StoreResult<bool>;
    /// The row at `at`, held until the unit ends.
    fn hold_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>>;
    /// Writes `new` over the row at `at` if it still holds `old`.
    fn replace_row<A: RowAt>(&mut self, at: A, old: &A::Row, new: &A::Row) -> StoreResult<bool>;
    /// Deletes at most `limit` rows of kind `R` whose [`TableRow::ends_at`] is by `cutoff_ms`.
    fn sweep_rows<R: TableRow>(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;

    /// Deletes every budget and row of entries of `key`; returns how many rows went.
    fn delete_key(&mut self, key: &str) -> StoreResult<i64>;

    /// At most `limit` budget rows that [`crate::budget::is_near`] `fraction` at `now_ms`,
    /// in [`crate::budget::near_order`] (no lock; a scan of every budget row).
    fn budgets_near(&mut self, fraction: f64, now_ms: i64, limit: i64) -> StoreResult<Vec<NearBudget>>;

    /// Keeps an ended period for invoicing, unless one with its key, period and end is kept.
    fn keep_usage(&mut self, usage: &UsagePeriod) -> StoreResult<()>;
    /// At most `limit` budget rows whose period ended by `cutoff_ms` with something counted
    /// (key, period, row), in key and period order (no lock).
    fn ended_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<Vec<(String, String, BudgetState)>>;
    /// The kept periods of `of` that ended after `from_ms` and by `to_ms`, by end, then key,
    /// then period (in byte order), at most `limit` (no lock).
    fn read_usage(&mut self, of: UsageOf, from_ms: i64, to_ms: i64, limit: i64) -> StoreResult<Vec<UsagePeriod>>;
    /// Deletes at most `limit` kept periods that ended by `cutoff_ms`.
    fn sweep_usage(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// The installation's setting `name` (rl_setting), None when never set.
    fn read_setting(&mut self, name: &str) -> StoreResult<Option<i64>>;
    /// Sets the installation's setting `name`.
    fn write_setting(&mut self, name: &str, value: i64) -> StoreResult<()>;

    /// The stored definition of policy `name`.
    fn read_policy(&mut self, name: &str) -> StoreResult<Option<StoredPolicy>>;
    /// Stores `definition` as policy `name` under a new `revision`, replacing any.
    fn put_policy(&mut self, name: &str, definition: &str, revision: i64) -> StoreResult<()>;
    /// Deletes policy `name`; returns whether it existed.
    fn delete_policy(&mut self, name: &str) -> StoreResult<bool>;
    /// Every subject's row of strikes and blocks (subject, entries), at most `limit`
    /// (no lock); None where the store cannot list them.
    fn read_strike_rows(&mut self, _limit: i64) -> StoreResult<Option<Vec<(String, String)>>> {
        Ok(None)
    }

    /// The checks epoch: a number that moves whenever a policy is set or dropped, or a
    /// subject comes to have a recorded block ([`crate::penalty::records_new_block`]), as
    /// this connection sees the database. What rl_check read at one epoch (policies, the
    /// subjects with blocks) holds while the epoch stands. None where the store cannot tell.
    fn checks_epoch(&mut self) -> Option<u64> {
        None
    }
    /// Whether [`TableRows::checks_epoch`] is a number in this session's own memory, free
    /// to read and exact right before a write (PostgreSQL: moved by the invalidations
    /// other sessions send at commit). Else a write that depends on it tests the epoch in
    /// its own statement.
    const CHECKS_EPOCH_IN_MEMORY: bool = false;
    /// Where the store keeps the checks epoch in memory and `guard` carries one, whether it
    /// is unmoved (then [`BucketRows::change_bucket_for_policy`] is rl_take's own write);
    /// None otherwise.
    fn epoch_unmoved_in_memory(&mut self, guard: &PolicyGuard) -> Option<bool> {
        let epoch = guard.epoch.filter(|_| Self::CHECKS_EPOCH_IN_MEMORY)?;
        Some(self.checks_epoch() == Some(epoch))
    }
    /// Has the checks epoch move for every session once this transaction commits (a
    /// store whose epoch moves by itself, as SQLite's triggers move it, does nothing).
    fn checks_changed(&mut self) -> StoreResult<()> {
        Ok(())
    }
}

/// The store a call runs over: buckets and tables, which may live apart.
pub trait Store: BucketRows + TableRows {}

impl<S: BucketRows + TableRows> Store for S {}

/// A store whose tables are another store's (the memory store keeps buckets itself and
/// everything else where the SQL store keeps it): [`TableRows`] comes from here, written
/// once for every such store.
pub trait TablesElsewhere {
    type Tables: TableRows;
    fn tables(&mut self) -> &mut Self::Tables;
}

impl<S: TablesElsewhere> TableRows for S {
    const LOCKS_ROWS: bool = S::Tables::LOCKS_ROWS;
    const CHECKS_EPOCH_IN_MEMORY: bool = S::Tables::CHECKS_EPOCH_IN_MEMORY;
    fn read_only(&mut self) -> StoreResult<bool> {
        self.tables().read_only()
    }
    fn begin_unit(&mut self) -> StoreResult<bool> {
        self.tables().begin_unit()
    }
    fn end_unit(&mut self, owned: bool, commit: bool) -> StoreResult<()> {
        self.tables().end_unit(owned, commit)
    }
    fn change_budget(&mut self, key: &str, period: Period, d: Decide<BudgetState>) -> ChangeResult<BudgetState> {
        self.tables().change_budget(key, period, d)
    }
    fn read_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>> {
        self.tables().read_row(at)
    }
    fn insert_row<A: RowAt>(&mut self, at: A, row: &A::Row) -> StoreResult<bool> {
        self.tables().insert_row(at, row)
    }
    fn hold_row<A: RowAt>(&mut self, at: A) -> StoreResult<Option<A::Row>> {
        self.tables().hold_row(at)
    }
    fn replace_row<A: RowAt>(&mut self, at: A, old: &A::Row, new: &A::Row) -> StoreResult<bool> {
        self.tables().replace_row(at, old, new)
    }
    fn sweep_rows<R: TableRow>(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        self.tables().sweep_rows::<R>(cutoff_ms, limit)
    }
    fn delete_key(&mut self, key: &str) -> StoreResult<i64> {
        self.tables().delete_key(key)
    }
    fn budgets_near(&mut self, fraction: f64, now_ms: i64, limit: i64) -> StoreResult<Vec<NearBudget>> {
        self.tables().budgets_near(fraction, now_ms, limit)
    }
    fn keep_usage(&mut self, usage: &UsagePeriod) -> StoreResult<()> {
        self.tables().keep_usage(usage)
    }
    fn ended_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<Vec<(String, String, BudgetState)>> {
        self.tables().ended_budgets(cutoff_ms, limit)
    }
    fn read_usage(&mut self, of: UsageOf, from_ms: i64, to_ms: i64, limit: i64) -> StoreResult<Vec<UsagePeriod>> {
        self.tables().read_usage(of, from_ms, to_ms, limit)
    }
    fn sweep_usage(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        self.tables().sweep_usage(cutoff_ms, limit)
    }
    fn read_setting(&mut self, name: &str) -> StoreResult<Option<i64>> {
        self.tables().read_setting(name)
    }
    fn write_setting(&mut self, name: &str, value: i64) -> StoreResult<()> {
        self.tables().write_setting(name, value)
    }
    fn read_policy(&mut self, name: &str) -> StoreResult<Option<StoredPolicy>> {
        self.tables().read_policy(name)
    }
    fn put_policy(&mut self, name: &str, definition: &str, revision: i64) -> StoreResult<()> {
        self.tables().put_policy(name, definition, revision)
    }
    fn delete_policy(&mut self, name: &str) -> StoreResult<bool> {
        self.tables().delete_policy(name)
    }
    fn read_strike_rows(&mut self, limit: i64) -> StoreResult<Option<Vec<(String, String)>>> {
        self.tables().read_strike_rows(limit)
    }
    fn checks_epoch(&mut self) -> Option<u64> {
        self.tables().checks_epoch()
    }
    fn checks_changed(&mut self) -> StoreResult<()> {
        self.tables().checks_changed()
    }
}
