//! The seam between the rules and an engine: what an engine must do with state rows, split
//! by the two protocols that use it ([`crate::protocol`]).
//!
//! - [`RowStore`]: single-row calls (rl_take, rl_spend, the refunds, the peeks, rl_sweep).
//!   A change is one guarded write: the engine hands the row it is about to change to the
//!   call's decision and writes what that decision wants, in one step. A refusal writes
//!   nothing. Only a missing row takes a second step, an insert that may lose to a
//!   concurrent one.
//! - [`LockingStore`]: calls on several rows (rl_take_all, rl_reset), and on rows of
//!   entries (sliding windows, leases), whose decisions are too large for a guarded write.
//!   One unit that reads each row holding it (PostgreSQL: FOR UPDATE; SQLite: the write
//!   lock of BEGIN IMMEDIATE), decides, and writes each row only if it still holds what
//!   was read.

use crate::bucket::BucketState;
use crate::budget::BudgetState;
use crate::decision_slot::Decide;
use crate::multi::BucketItem;
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

/// What a guarded write did: the row it last decided on (None: there was no row), and
/// whether it wrote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Changed<T> {
    pub decided_on: Option<T>,
    pub written: bool,
}

/// What [`RowStore::change_bucket`] and [`RowStore::change_budget`] return.
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

/// Single-row reads and guarded writes.
pub trait RowStore {
    /// Whether the home of `rows` refuses writes (a read-only database or transaction).
    fn read_only(&mut self, rows: Rows) -> StoreResult<bool>;
    /// The bucket row of `key`, as it stands (no lock).
    fn read_bucket(&mut self, key: &str) -> StoreResult<Option<BucketState>>;
    /// The budget row of `key` and `period`, as it stands (no lock).
    fn read_budget(&mut self, key: &str, period: Period) -> StoreResult<Option<BudgetState>>;
    /// Inserts the bucket row of `key` unless one exists; returns whether it did.
    fn insert_bucket(&mut self, key: &str, row: &BucketState) -> StoreResult<bool>;
    /// Inserts the budget row of `key` and `period` unless one exists; returns whether it did.
    fn insert_budget(&mut self, key: &str, period: Period, row: &BudgetState) -> StoreResult<bool>;
    /// One guarded write of the bucket row of `key`: calls `decide` with the row as it
    /// stands when the write reaches it (again, if a concurrent write makes it re-check a
    /// newer version) and stores what the last call returned, if anything. `decide` is
    /// never called when there is no row.
    fn change_bucket(&mut self, key: &str, decide: Decide<BucketState>) -> ChangeResult<BucketState>;
    /// [`RowStore::change_bucket`] for the budget row of `key` and `period`.
    fn change_budget(&mut self, key: &str, period: Period, d: Decide<BudgetState>)
        -> StoreResult<Changed<BudgetState>>;
    /// Deletes at most `limit` buckets that are full by `cutoff_ms`, re-checking `full_at`
    /// on the row it deletes, so a row a concurrent take just refilled stays.
    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// Deletes at most `limit` budgets whose period ended by `cutoff_ms`.
    fn sweep_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// The row of entries of `kind` under `key`, as it stands (no lock).
    fn read_entries(&mut self, kind: EntryKind, key: &str) -> StoreResult<Option<EntriesRow>>;
    /// Inserts the row of entries of `kind` under `key` unless one exists; returns whether it did.
    fn insert_entries(&mut self, kind: EntryKind, key: &str, row: &EntriesRow) -> StoreResult<bool>;
    /// Deletes at most `limit` rows of entries empty by `cutoff_ms`.
    fn sweep_entries(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64>;
    /// The stored definition of policy `name`.
    fn read_policy(&mut self, name: &str) -> StoreResult<Option<StoredPolicy>>;
    /// Stores `definition` as policy `name` under a new `revision`, replacing any.
    fn put_policy(&mut self, name: &str, definition: &str, revision: i64) -> StoreResult<()>;
    /// Deletes policy `name`; returns whether it existed.
    fn delete_policy(&mut self, name: &str) -> StoreResult<bool>;
    /// The checks epoch: a number that moves whenever a policy is set or dropped, or a
    /// subject comes to have a recorded block ([`crate::penalty::records_new_block`]), as
    /// this connection sees the database. What rl_check read at one epoch (policies, the
    /// subjects with blocks) holds while the epoch stands. None where the store cannot tell.
    fn checks_epoch(&mut self) -> Option<u64> {
        None
    }
    /// Whether [`RowStore::checks_epoch`] is a number in this session's own memory, free
    /// to read and exact right before a write (PostgreSQL: moved by the invalidations
    /// other sessions send at commit). Else a write that depends on it tests the epoch in
    /// its own statement.
    const CHECKS_EPOCH_IN_MEMORY: bool = false;
    /// Where the store keeps the checks epoch in memory and `guard` carries one, whether it
    /// is unmoved (then [`RowStore::change_bucket_for_policy`] is rl_take's own write);
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
    /// Every subject's row of strikes and blocks (subject, entries), at most `limit`
    /// (no lock); None where the store cannot list them.
    fn read_strike_rows(&mut self, _limit: i64) -> StoreResult<Option<Vec<(String, String)>>> {
        Ok(None)
    }
    /// [`RowStore::change_bucket`], only while `guard` holds; otherwise, or where the store
    /// cannot test it, it writes nothing and reports no row (this default), and rl_check
    /// takes its general path.
    fn change_bucket_for_policy(
        &mut self,
        _key: &str,
        _guard: &PolicyGuard,
        _decide: Decide<BucketState>,
    ) -> ChangeResult<BucketState> {
        Ok(Changed { decided_on: None, written: false })
    }
}

/// A policy as stored: its definition and the revision every rl_policy_set gives it anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPolicy {
    pub definition: String,
    pub revision: i64,
}

/// What rl_check's one-statement path must still find true when it writes
/// ([`RowStore::change_bucket_for_policy`]).
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

/// Several rows changed as one unit.
pub trait LockingStore: RowStore {
    /// Whether a held row is locked by itself (PostgreSQL), which a missing row cannot be,
    /// rather than by a lock on the whole database (SQLite).
    const LOCKS_ROWS: bool;
    /// Makes the following statements one unit that holds the write lock from its start,
    /// unless the caller's own transaction already is one. Returns whether it began one.
    fn begin_unit(&mut self) -> StoreResult<bool>;
    /// Ends what [`LockingStore::begin_unit`] began (`owned`): commit, or roll back.
    fn end_unit(&mut self, owned: bool, commit: bool) -> StoreResult<()>;
    /// The budget row of `key` and `period`, held until the unit ends.
    fn hold_budget(&mut self, key: &str, period: Period) -> StoreResult<Option<BudgetState>>;
    /// Holds the bucket rows of `items` (in this order, keys all different), hands them to
    /// `decide` and, still holding them, stores each row it returns (Some) in the same
    /// order. Returns what `decide` answered alongside.
    fn decide_buckets<R>(
        &mut self,
        items: &[&BucketItem],
        decide: impl FnOnce(&[Option<BucketState>]) -> (Vec<Option<BucketState>>, R),
    ) -> StoreResult<R>;
    /// Writes `new` over the budget row of `key` and `period` if it still holds `expected`.
    fn replace_budget(&mut self, key: &str, period: Period, old: &BudgetState, new: &BudgetState) -> StoreResult<bool>;
    /// The row of entries of `kind` under `key`, held until the unit ends.
    fn hold_entries(&mut self, kind: EntryKind, key: &str) -> StoreResult<Option<EntriesRow>>;
    /// Writes `new` over the row of entries of `kind` under `key` if it still holds `old`.
    fn replace_entries(&mut self, kind: EntryKind, key: &str, old: &EntriesRow, new: &EntriesRow) -> StoreResult<bool>;
    /// Deletes every row of `key`: bucket, budgets, windows and leases.
    fn delete_key(&mut self, key: &str) -> StoreResult<i64>;
}
