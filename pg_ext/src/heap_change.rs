//! The table store's hot write, a bucket row changed by rl_take, rl_refund or rl_charge,
//! done in the heap directly, as logical replication's apply worker changes rows: the key
//! looked up in the primary key, the decision made on the row the statement's snapshot
//! sees, `heap_update` (which waits for a concurrent writer, as an UPDATE does), and where
//! another transaction changed the row first, its newest version locked and decided on
//! again: what EvalPlanQual gives the guarded UPDATE (`sql/statements/bucket_change.sql`). This skips
//! that statement's plan cache, executor start-up and four SQL function calls.
//!
//! Only where the two cannot differ ([`Shape`] names each condition): a read committed
//! transaction (a repeatable read or serializable one must fail on a concurrent update, as
//! its UPDATE does), a writable one, no `ExecutorCheckPerms_hook` (pgaudit, sepgsql), and
//! `ratelimit.rl_bucket` as the extension made it: a plain heap table of the four columns,
//! without triggers, rules, row security, CHECK constraints (valid or not), identity or
//! generated columns, partitioning or inheritance children, published for updates by no
//! publication, updatable by the caller, and whose only index is a valid btree primary key
//! on exactly `(key)` with text's default operator class and the database's default
//! collation. The table's shape is judged once per relcache entry ([`forget`] runs on its
//! invalidation). Elsewhere, and with `pg_ratelimit.direct_writes` off (the default), the
//! guarded UPDATE runs, which enforces each of those as PostgreSQL does.
//!
//! Writes `unsafe` (the workspace denies it elsewhere): heap and index access are C
//! functions over raw pointers, each used as PostgreSQL's own executor uses it.

#![allow(unsafe_code)]

use crate::settings::DIRECT_WRITES;
use pgrx::{pg_sys, FromDatum, IntoDatum, PgTupleDesc};
use ratelimit_core::bucket::BucketState;
use ratelimit_core::decision_slot::Decide;
use ratelimit_core::store::{ChangeResult, Changed};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};

/// The columns of rl_bucket, in order (sql/schema/pg_schema.sql).
const COLUMNS: [pg_sys::Oid; 4] = [pg_sys::TEXTOID, pg_sys::FLOAT8OID, pg_sys::INT8OID, pg_sys::INT8OID];

/// The table's shape as last judged: the oid of rl_bucket, the user it was judged for,
/// and its primary key when the direct write may run on it (0: it may not). Zeroed by
/// [`forget`], so the next call judges again.
static JUDGED_TABLE: AtomicU32 = AtomicU32::new(0);
static JUDGED_USER: AtomicU32 = AtomicU32::new(0);
static USABLE_INDEX: AtomicU32 = AtomicU32::new(0);

/// From the relcache invalidation callback: any change to `relid` (InvalidOid: to any
/// relation) means the shape is judged again.
pub(crate) fn forget(relid: pg_sys::Oid) {
    let table = JUDGED_TABLE.load(Ordering::Relaxed);
    if relid == pg_sys::InvalidOid || relid.to_u32() == table || USABLE_INDEX.load(Ordering::Relaxed) == relid.to_u32()
    {
        JUDGED_TABLE.store(0, Ordering::Relaxed);
    }
}

/// Whether this call may change a bucket row directly: the setting, the transaction and
/// the hooks, then the table's shape (judged once per relcache entry).
pub(crate) fn applies() -> bool {
    if !DIRECT_WRITES.get() {
        return false;
    }
    // SAFETY: backend-global transaction state and hook, read on the backend's only thread.
    unsafe {
        !pg_sys::XactReadOnly
            && pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32
            && std::ptr::addr_of!(pg_sys::ExecutorCheckPerms_hook).read().is_none()
    }
}

/// Changes the bucket row of `key` by `decide`; None where the guarded UPDATE must run
/// (the table is not in the shape [`Shape`] requires). Call only where [`applies`].
pub(crate) fn change_bucket(key: &str, decide: &Decide<BucketState>) -> Option<ChangeResult<BucketState>> {
    // SAFETY: the relation is opened, checked and closed here (its lock kept to the end of
    // the transaction, as an UPDATE keeps it).
    unsafe {
        let namespace = pg_sys::get_namespace_oid(c"ratelimit".as_ptr(), true);
        let table = pg_sys::get_relname_relid(c"rl_bucket".as_ptr(), namespace);
        if table == pg_sys::InvalidOid {
            return None;
        }
        let rel = pg_sys::table_open(table, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let user = pg_sys::GetUserId();
        // the lock taken above has run every invalidation queued for the table
        if JUDGED_TABLE.load(Ordering::Relaxed) != table.to_u32()
            || JUDGED_USER.load(Ordering::Relaxed) != user.to_u32()
        {
            let index = Shape::judge(rel, user).usable_index();
            USABLE_INDEX.store(index.map_or(0, |i| i.to_u32()), Ordering::Relaxed);
            JUDGED_USER.store(user.to_u32(), Ordering::Relaxed);
            JUDGED_TABLE.store(table.to_u32(), Ordering::Relaxed);
        }
        let index = match USABLE_INDEX.load(Ordering::Relaxed) {
            0 => None,
            oid => Some(pg_sys::Oid::from(oid)),
        };
        let changed = index.map(|index| change_in(rel, index, key, decide));
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        changed.map(Ok)
    }
}

/// What the direct write needs of rl_bucket, each a way the guarded UPDATE would act
/// differently if it did not hold.
#[derive(Debug, Default)]
struct Shape {
    /// a plain heap table (not partitioned, a view or a foreign table), not a partition,
    /// without inheritance children
    plain_heap: bool,
    /// no row trigger, rule or row security: the UPDATE would run or obey them
    nothing_fires: bool,
    /// the four columns of sql/schema/pg_schema.sql, no identity or generated column
    columns: bool,
    /// no CHECK constraint, valid or NOT VALID: the UPDATE checks every one
    no_checks: bool,
    /// published for updates by no publication (with a row filter or a column list, the
    /// UPDATE fails where the replica identity does not cover them; with neither, the
    /// executor's replica identity check is the UPDATE's to make)
    unpublished: bool,
    /// the caller may UPDATE and SELECT the table, as the UPDATE's permission check asks
    permitted: bool,
    /// the primary key on exactly (key), the only index: btree, valid, text's default
    /// operator class, the column's collation, which is deterministic
    key_index: Option<pg_sys::Oid>,
}

impl Shape {
    /// # Safety
    /// `rel` is open.
    unsafe fn judge(rel: pg_sys::Relation, user: pg_sys::Oid) -> Shape {
        // SAFETY: as the function's contract says; the lists are fresh copies.
        unsafe {
            let form = &*(*rel).rd_rel;
            let desc = PgTupleDesc::from_pg_unchecked((*rel).rd_att);
            let constr = (*(*rel).rd_att).constr;
            let mut publication: pg_sys::PublicationDesc = std::mem::zeroed();
            pg_sys::RelationBuildPublicationDesc(rel, &mut publication);
            let acl =
                pg_sys::pg_class_aclcheck(form.oid, user, (pg_sys::ACL_UPDATE | pg_sys::ACL_SELECT) as pg_sys::AclMode);
            Shape {
                plain_heap: form.relkind as u8 == pg_sys::RELKIND_RELATION
                    && !form.relispartition
                    && !form.relhassubclass
                    && std::ptr::eq((*rel).rd_tableam, pg_sys::GetHeapamTableAmRoutine()),
                nothing_fires: (*rel).trigdesc.is_null()
                    && (*rel).rd_rules.is_null()
                    && !form.relhasrules
                    && !form.relrowsecurity
                    && form.relreplident as u8 == pg_sys::REPLICA_IDENTITY_DEFAULT,
                columns: desc.len() == COLUMNS.len()
                    && desc.iter().zip(COLUMNS).all(|(att, type_oid)| {
                        !att.attisdropped && att.atttypid == type_oid && att.attidentity == 0 && att.attgenerated == 0
                    }),
                no_checks: constr.is_null() || (*constr).num_check == 0,
                unpublished: !publication.pubactions.pubupdate,
                permitted: acl == pg_sys::AclResult::ACLCHECK_OK,
                key_index: key_index(rel, &desc),
            }
        }
    }

    fn usable_index(&self) -> Option<pg_sys::Oid> {
        let Shape { plain_heap, nothing_fires, columns, no_checks, unpublished, permitted, key_index } = *self;
        (plain_heap && nothing_fires && columns && no_checks && unpublished && permitted).then_some(key_index).flatten()
    }
}

/// The primary key of `rel` if it is its only index and exactly the one the extension
/// made: a valid btree on `(key)` alone, no INCLUDE columns, text's default operator
/// class, and the database's default collation (a deterministic one) on column and key.
///
/// # Safety
/// `rel` is open; `desc` is its tuple descriptor.
unsafe fn key_index(rel: pg_sys::Relation, desc: &PgTupleDesc) -> Option<pg_sys::Oid> {
    // SAFETY: as the function's contract says; the index is opened and closed here.
    unsafe {
        let indexes = pg_sys::RelationGetIndexList(rel);
        let only = (!indexes.is_null() && (*indexes).length == 1).then(|| (*(*indexes).elements).oid_value)?;
        if only != (*rel).rd_pkindex || desc.is_empty() {
            return None;
        }
        let index_rel = pg_sys::index_open(only, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let index = &*(*index_rel).rd_index;
        let key_column = desc.get(0)?;
        let text_ops = pg_sys::GetDefaultOpClass(pg_sys::TEXTOID, pg_sys::BTREE_AM_OID);
        let exact = (*(*index_rel).rd_rel).relam == pg_sys::BTREE_AM_OID
            && index.indisprimary
            && index.indisunique
            && index.indisvalid
            && index.indisready
            && index.indislive
            && index.indnatts == 1
            && index.indnkeyatts == 1
            && index.indkey.values.as_slice(1)[0] == 1
            && text_ops != pg_sys::InvalidOid
            && *(*index_rel).rd_opfamily == pg_sys::get_opclass_family(text_ops)
            && *(*index_rel).rd_opcintype == pg_sys::TEXTOID
            && key_column.attcollation == pg_sys::DEFAULT_COLLATION_OID
            && *(*index_rel).rd_indcollation == pg_sys::DEFAULT_COLLATION_OID
            && pg_sys::get_collation_isdeterministic(pg_sys::DEFAULT_COLLATION_OID);
        pg_sys::index_close(index_rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        exact.then_some(only)
    }
}

/// The change itself, on `rel` (open) through its primary key `index`.
///
/// # Safety
/// `rel` is open with RowExclusiveLock and `index` is its primary key on the text column 1.
unsafe fn change_in(
    rel: pg_sys::Relation,
    index: pg_sys::Oid,
    key: &str,
    decide: &Decide<BucketState>,
) -> Changed<BucketState> {
    // SAFETY: as the function's contract says. Every pointer below is made here and lives
    // until the end of this function (the slot pins the buffer of the row it holds); an
    // ERROR raised inside a call unwinds, and the transaction's abort releases the rest.
    unsafe {
        // As SPI does around a statement that writes: see this transaction's earlier
        // changes, under a fresh snapshot in read committed.
        pg_sys::CommandCounterIncrement();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        let snapshot = pg_sys::GetActiveSnapshot();
        let index_rel = pg_sys::index_open(index, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let slot = pg_sys::table_slot_create(rel, null_mut());

        let mut scan_key: pg_sys::ScanKeyData = std::mem::zeroed();
        let key_text = pg_sys::cstring_to_text_with_len(key.as_ptr().cast(), key.len() as i32);
        pg_sys::ScanKeyInit(
            &mut scan_key,
            1,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            pg_sys::Datum::from(key_text),
        );
        // compare as the index sorts (its collation), as the UPDATE's index scan would
        scan_key.sk_collation = *(*index_rel).rd_indcollation;
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(rel, index_rel, snapshot, null_mut(), 1, 0);
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(rel, index_rel, snapshot, 1, 0);
        pg_sys::index_rescan(scan, &mut scan_key, 1, null_mut(), 0);
        let found = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
        pg_sys::index_endscan(scan);

        let changed = if found {
            write_decided(rel, index_rel, snapshot, slot, key, decide)
        } else {
            Changed { decided_on: None, written: false }
        };

        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_close(index_rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::PopActiveSnapshot();
        // as after SPI's statement: the next statement, or the next call in this one, sees it
        pg_sys::CommandCounterIncrement();
        changed
    }
}

/// Decides on the row in `slot` and writes what the decision wants; on a row another
/// transaction changed first, locks its newest version (in the mode heap_update asked
/// for), tests its key again and decides again, as EvalPlanQual does for the UPDATE.
///
/// # Safety
/// As [`change_in`]; `slot` holds a row of `rel` found under `snapshot`.
unsafe fn write_decided(
    rel: pg_sys::Relation,
    index_rel: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    slot: *mut pg_sys::TupleTableSlot,
    key: &str,
    decide: &Decide<BucketState>,
) -> Changed<BucketState> {
    // SAFETY: as the function's contract says.
    unsafe {
        let command = pg_sys::GetCurrentCommandId(true);
        let mut newest_version = false;
        loop {
            let (row, mut values) = read_row(rel, slot);
            // the UPDATE's WHERE key = $1, tested again on the newest version
            if newest_version && String::from_datum(values[0], false).as_deref() != Some(key) {
                return Changed { decided_on: None, written: false };
            }
            let Some(new) = decide(&row) else { return Changed { decided_on: Some(row), written: false } };
            values[1] = new.level.into_datum().expect("a float8 datum");
            values[2] = new.refilled_at.into_datum().expect("an int8 datum");
            values[3] = new.full_at.into_datum().expect("an int8 datum");
            let mut nulls = [false; COLUMNS.len()];
            let tuple = pg_sys::heap_form_tuple((*rel).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            let mut old_tid = (*slot).tts_tid;
            let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
            let (result, index_too, lock_mode) = update_waiting(rel, &mut old_tid, tuple, command, &mut failure);
            match result {
                pg_sys::TM_Result::TM_Ok => {
                    if index_too {
                        insert_key(rel, index_rel, values[0], tuple);
                    }
                    pg_sys::heap_freetuple(tuple);
                    return Changed { decided_on: Some(row), written: true };
                }
                // another transaction changed the row after our snapshot: lock its newest
                // version and decide again on that
                pg_sys::TM_Result::TM_Updated => {
                    pg_sys::heap_freetuple(tuple);
                    let lock = (*(*rel).rd_tableam).tuple_lock.expect("heap tables lock tuples");
                    let locked = lock(
                        rel,
                        &mut old_tid,
                        snapshot,
                        slot,
                        command,
                        lock_mode,
                        pg_sys::LockWaitPolicy::LockWaitBlock,
                        pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION as u8,
                        &mut failure,
                    );
                    match locked {
                        pg_sys::TM_Result::TM_Ok => {
                            newest_version = true;
                            continue;
                        }
                        // deleted meanwhile (a sweep): as the UPDATE, change nothing
                        pg_sys::TM_Result::TM_Deleted => return Changed { decided_on: Some(row), written: false },
                        other => pgrx::error!("could not lock the bucket row to change it (result {other})"),
                    }
                }
                pg_sys::TM_Result::TM_Deleted => return Changed { decided_on: Some(row), written: false },
                other => pgrx::error!("could not change the bucket row (result {other})"),
            }
        }
    }
}

/// heap_update of `tid` to `tuple`, waiting for a concurrent writer as an UPDATE does;
/// with whether the new version needs an index entry (it left the page: not HOT) and the
/// lock mode to take the newest version in when another transaction updated it first.
///
/// # Safety
/// As [`write_decided`]; `tuple` is a new version of the row at `tid`.
unsafe fn update_waiting(
    rel: pg_sys::Relation,
    tid: pg_sys::ItemPointer,
    tuple: pg_sys::HeapTuple,
    command: pg_sys::CommandId,
    failure: &mut pg_sys::TM_FailureData,
) -> (pg_sys::TM_Result::Type, bool, pg_sys::LockTupleMode::Type) {
    let mut lock_mode: pg_sys::LockTupleMode::Type = 0;
    // SAFETY: as the function's contract says; no crosscheck snapshot, as for an UPDATE.
    unsafe {
        // PostgreSQL 16 reports which indexes need the new version; 15 marks it heap-only.
        #[cfg(feature = "pg15")]
        let result = pg_sys::heap_update(rel, tid, tuple, command, null_mut(), true, failure, &mut lock_mode);
        #[cfg(feature = "pg15")]
        let index_too = !pg_sys::HeapTupleHeaderIsHeapOnly((*tuple).t_data);
        #[cfg(not(feature = "pg15"))]
        let mut indexes = pg_sys::TU_UpdateIndexes::TU_None;
        #[cfg(not(feature = "pg15"))]
        let result =
            pg_sys::heap_update(rel, tid, tuple, command, null_mut(), true, failure, &mut lock_mode, &mut indexes);
        #[cfg(not(feature = "pg15"))]
        let index_too = indexes == pg_sys::TU_UpdateIndexes::TU_All;
        (result, index_too, lock_mode)
    }
}

/// The bucket in `slot`, and the row's datums (the key's still pointing into the row).
///
/// # Safety
/// `slot` holds a row of `rel`.
unsafe fn read_row(rel: pg_sys::Relation, slot: *mut pg_sys::TupleTableSlot) -> (BucketState, [pg_sys::Datum; 4]) {
    // SAFETY: as the function's contract says; the columns are NOT NULL of the types
    // key_index checked.
    unsafe {
        let mut should_free = false;
        let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut should_free);
        let mut values = [pg_sys::Datum::from(0); COLUMNS.len()];
        let mut nulls = [false; COLUMNS.len()];
        pg_sys::heap_deform_tuple(tuple, (*rel).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
        let row = BucketState {
            level: f64::from_datum(values[1], nulls[1]).unwrap_or(0.0),
            refilled_at: i64::from_datum(values[2], nulls[2]).unwrap_or(0),
            full_at: i64::from_datum(values[3], nulls[3]).unwrap_or(0),
        };
        (row, values)
    }
}

/// Points the primary key at the new version `tuple` of a row (an update that could not
/// stay on its page), as the executor's index maintenance does.
///
/// # Safety
/// `tuple` was just written to `rel` by heap_update; `key` is its key column.
unsafe fn insert_key(rel: pg_sys::Relation, index_rel: pg_sys::Relation, key: pg_sys::Datum, tuple: pg_sys::HeapTuple) {
    // SAFETY: as the function's contract says.
    unsafe {
        let info = pg_sys::BuildIndexInfo(index_rel);
        let mut values = [key];
        let mut nulls = [false];
        pg_sys::index_insert(
            index_rel,
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
            &mut (*tuple).t_self,
            rel,
            pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES,
            true,
            info,
        );
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        pg_sys::index_insert_cleanup(index_rel, info);
    }
}
