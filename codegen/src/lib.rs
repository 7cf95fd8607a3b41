//! The files generated from the core's function table ([`ratelimit_core::functions`]) and
//! error texts ([`ratelimit_core::messages`]), kept out of the runtime crate that the engines
//! link: the SQL edition's script ([`sql_edition`], by `scripts/package.sh` through
//! `examples/sql_edition.rs`), the privileges every install ends with ([`privileges`]), and
//! the committed files `tests/generated.rs` checks ([`generated`]: `sql/schema/pg_finalize.sql`, the
//! open upgrade script's blocks, `docs/reference.md`, `tests/functions.json`;
//! `make reference` rewrites them).

pub mod generated;
pub mod privileges;
pub mod sql_edition;
