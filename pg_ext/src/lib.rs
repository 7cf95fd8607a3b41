//! PostgreSQL extension pg_ratelimit: the rl_* functions over the shared core. Glue only,
//! one module per subject:
//! - [`wrappers`]: one SQL function per entry of the core's table
//!   ([`ratelimit_core::functions`]), a few lines each, handing its arguments to
//!   [`dispatch::run`];
//! - [`dispatch`]: a call over the table or memory store, and its errors with their SQLSTATE;
//! - [`spi`]: the core's statements through SPI, plans prepared once per backend;
//! - [`heap_change`]: the table store's bucket rows changed without a statement;
//! - [`jsonb`]: answers laid out as `jsonb`; `jsonb` arguments read within a bound;
//! - [`invalidation`]: policy changes and Citus's distribution, followed through the relcache;
//! - [`shared_memory`]: the memory store; [`settings`]: the `pg_ratelimit.*` settings;
//! - [`citus_guard`]: calls in shapes that crash Citus's delegation, refused while planning;
//! - [`self_test`]: the in-server tests, shipped as `rl_self_test()`.
//!
//! `unsafe` is denied by the workspace and allowed, with the reason, in `jsonb`,
//! `invalidation`, `shared_memory`, `heap_change`, `citus_guard`, `self_test`, and one
//! function each of `settings` and `spi` (and in what pgrx's macros expand to).

mod citus_guard;
mod dispatch;
mod heap_change;
mod invalidation;
mod jsonb;
mod self_test;
mod settings;
mod shared_memory;
mod spi;
mod wrappers;

use pgrx::prelude::*;

::pgrx::pg_module_magic!(name, version);

pgrx::extension_sql_file!("../../sql/schema/pg_schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!(
    "../../sql/schema/pg_stats_view.sql",
    name = "stats_view",
    requires = [wrappers::rl_policy_stats, wrappers::rl_top_refused]
);
pgrx::extension_sql_file!("../../sql/schema/pg_finalize.sql", name = "comments", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::define();
    shared_memory::init();
    ratelimit_core::stats::install(&shared_memory::COUNTERS);
    settings::reserve_prefix();
    invalidation::watch_policy_changes();
    citus_guard::install();
}
