//! The `pg_ratelimit.*` settings: defined once per process from `_PG_init`, read per call.

use pgrx::{pg_sys, GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// An explicit now_ms can refill a bucket early, so only a superuser may allow it.
pub static ALLOW_EXPLICIT_CLOCK: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Where buckets live. The two homes hold different state, so a role that could switch
/// would escape its limits: only a superuser (or configuration one wrote) may set it.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum BucketHome {
    #[name = c"table"]
    Table,
    #[name = c"memory"]
    Memory,
}

pub static BUCKETS: GucSetting<BucketHome> = GucSetting::<BucketHome>::new(BucketHome::Table);

/// Whether calls in the shapes that crash Citus's delegation are refused before Citus sees
/// them ([`crate::citus_guard`]). Off only with a Citus that has the fix: a role that could
/// turn it off could restart the coordinator, so only a superuser may.
pub static CITUS_GUARD: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Whether the table store changes bucket rows in the heap directly ([`crate::heap_change`])
/// rather than through its guarded UPDATE. Both give the same answers wherever the direct
/// write runs (it falls back to the UPDATE wherever the two could differ). Off by default:
/// the harness measured 1.02x the UPDATE's calls per second with synchronous_commit on and
/// 1.13x with it off (bench/README.md), too little to be the default path. Only a superuser
/// may set it.
pub static DIRECT_WRITES: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Registers the settings; from _PG_init, once per process.
pub fn define() {
    GucRegistry::define_bool_guc(
        c"pg_ratelimit.allow_explicit_clock",
        c"Allows callers to pass now_ms to pg_ratelimit functions.",
        c"An explicit clock lets a caller refill buckets early; meant for tests and replays.",
        &ALLOW_EXPLICIT_CLOCK,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"pg_ratelimit.buckets",
        c"Where pg_ratelimit keeps token buckets: 'table' (durable, transactional) or 'memory' (shared memory).",
        c"The memory store needs pg_ratelimit in shared_preload_libraries; budgets always stay in their tables.",
        &BUCKETS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_ratelimit.citus_guard",
        c"Refuses pg_ratelimit calls in the shapes that crash Citus's function call delegation.",
        c"A NULL key, or arguments from a subquery or VALUES list in FROM, in a call Citus would delegate. \
          Turn off only with a Citus that has the fix (citus/function_call_delegation.patch).",
        &CITUS_GUARD,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_ratelimit.direct_writes",
        c"Changes the table store's bucket rows in the heap directly instead of through a guarded UPDATE.",
        c"The same lookup, decision, write and re-check on a concurrently changed row as the UPDATE, without its \
          executor; only in read committed, writable transactions, without an ExecutorCheckPerms_hook, and while \
          ratelimit.rl_bucket has the shape the extension made (else the UPDATE runs). Off by default.",
        &DIRECT_WRITES,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// Makes every other `pg_ratelimit.*` name an error instead of a silent placeholder (a
/// misspelt `pg_ratelimit.bukets` would otherwise do nothing), once all are defined.
#[allow(unsafe_code)]
pub fn reserve_prefix() {
    // SAFETY: called from _PG_init with a static NUL-terminated name, as PostgreSQL expects.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pg_ratelimit".as_ptr()) }
}
