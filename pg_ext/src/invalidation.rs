//! What this backend learns through relcache invalidations: the checks epoch (policies set or
//! dropped, new blocks) and whether Citus distributes the state tables. Writes `unsafe`
//! (the workspace denies it elsewhere): the callback and the catalog lookups are C calls.

#![allow(unsafe_code)]

use pgrx::pg_sys;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// The checks epoch as this backend has been told of it: moved by every relcache
/// invalidation of `ratelimit.rl_policy` (which [`checks_changed`] sends when a
/// transaction that set or dropped a policy, or recorded a new block, commits, and runs
/// locally at once or on rollback) and by every invalidation of everything (a sinval
/// queue overflow).
static CHECKS_EPOCH: AtomicU64 = AtomicU64::new(0);
/// The oid of `ratelimit.rl_policy` (0: not looked up yet, or invalidated since).
static POLICY_TABLE: AtomicU32 = AtomicU32::new(0);

/// Registers [`on_relcache_invalidation`]; from _PG_init, once per process.
pub fn watch_policy_changes() {
    // SAFETY: a callback PostgreSQL keeps for the life of the process; it calls nothing.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_invalidation), pg_sys::Datum::from(0)) }
}

unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let everything = relid == pg_sys::InvalidOid;
    let table = POLICY_TABLE.load(Ordering::Relaxed);
    // Before the oid is known, any invalidation may be the table's.
    if everything || table == 0 || relid.to_u32() == table {
        CHECKS_EPOCH.fetch_add(1, Ordering::Relaxed);
        POLICY_TABLE.store(0, Ordering::Relaxed);
    }
    // rl_bucket altered, or anything it depends on: its shape is judged again
    crate::heap_change::forget(relid);
    // Citus invalidates a table it distributes (or undistributes).
    if everything || STATE_TABLES.iter().any(|t| t.load(Ordering::Relaxed) == relid.to_u32()) {
        DISTRIBUTED.store(UNKNOWN, Ordering::Relaxed);
    }
}

/// The oid of table `name` of the schema ratelimit (InvalidOid when missing).
fn state_table(name: &std::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: catalog lookups by NUL-terminated names inside a transaction; both return
    // InvalidOid when missing.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"ratelimit".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(name.as_ptr(), schema)
    }
}

fn policy_table() -> pg_sys::Oid {
    state_table(c"rl_policy")
}

const UNKNOWN: u8 = 0;
const LOCAL: u8 = 1;
const SHARDED: u8 = 2;
/// Whether Citus distributes rl_bucket or rl_budget, as last looked up (UNKNOWN again after
/// an invalidation of either).
static DISTRIBUTED: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The oids of rl_bucket and rl_budget when DISTRIBUTED was looked up.
static STATE_TABLES: [AtomicU32; 2] = [AtomicU32::new(0), AtomicU32::new(0)];

/// Whether Citus distributes the bucket or budget table: looked up once, again only after
/// either table is invalidated. `sharded` asks Citus's catalog, present only with Citus.
pub fn state_is_distributed(sharded: impl FnOnce() -> Result<bool, String>) -> Result<bool, String> {
    match DISTRIBUTED.load(Ordering::Relaxed) {
        LOCAL => return Ok(false),
        SHARDED => return Ok(true),
        _ => {}
    }
    let tables = [state_table(c"rl_bucket"), state_table(c"rl_budget")];
    // SAFETY: a catalog lookup by a NUL-terminated name; InvalidOid when missing.
    let citus = unsafe {
        pg_sys::get_relname_relid(c"pg_dist_partition".as_ptr(), pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE))
    };
    let distributed = citus != pg_sys::InvalidOid && sharded()?;
    for (slot, oid) in STATE_TABLES.iter().zip(tables) {
        slot.store(oid.to_u32(), Ordering::Relaxed);
    }
    DISTRIBUTED.store(if distributed { SHARDED } else { LOCAL }, Ordering::Relaxed);
    Ok(distributed)
}

/// The checks epoch after taking in the invalidations other sessions sent; None in a
/// transaction whose snapshot may be older than a change this backend was told of.
pub fn checks_epoch() -> Option<u64> {
    // SAFETY: a backend-global setting, read on the backend's only thread.
    if unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        return None;
    }
    // SAFETY: what every lock acquisition does; runs the callbacks of what others changed.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    if POLICY_TABLE.load(Ordering::Relaxed) == 0 {
        let table = policy_table();
        if table == pg_sys::InvalidOid {
            return None;
        }
        POLICY_TABLE.store(table.to_u32(), Ordering::Relaxed);
    }
    Some(CHECKS_EPOCH.load(Ordering::Relaxed))
}

/// Has every session's [`checks_epoch`] move when this transaction commits (and this
/// session's at once).
pub fn checks_changed() {
    let table = policy_table();
    if table != pg_sys::InvalidOid {
        // SAFETY: queues a relcache invalidation of an existing relation in this transaction.
        unsafe { pg_sys::CacheInvalidateRelcacheByRelid(table) }
    }
}
