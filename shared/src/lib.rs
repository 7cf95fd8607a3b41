//! The engine-free core of pg_ratelimit / sqlite ratelimit.
//!
//! Every rule lives here; the engine crates only convert values, run statements and
//! return answers. Modules, leaves first:
//! - [`units`]: units, ranges and calendar periods.
//! - [`bucket`], [`budget`], [`window`], [`lease`], [`take_all`]: the arithmetic of each
//!   kind of limit, pure.
//! - [`args`]: engine values parsed into typed values, with every validation rule and its
//!   error text; [`call_args`]: each function's arguments read through its descriptor;
//!   [`limit_json`]: the one parser of limit objects (rl_take_all's items, policies' limits);
//!   [`render`]: answers as JSON; [`headers`], [`key`]: pure functions.
//! - [`store`]: the seam an engine implements; [`protocol`]: the flows that make each call
//!   atomic over it; [`decision_slot`]: how one SQL statement reaches a call's decision.
//! - [`memory`]: the memory store's table of buckets (PostgreSQL shared memory), pure;
//!   [`memory_store`]: the store that keeps buckets there and budgets in SQL.
//! - [`functions`]: every SQL function described once; [`calls`]: what each one runs;
//!   [`generated`]: the files written from the table; [`privileges`]: who may use each
//!   installed object, whatever the platform granted by default.
//! - [`stats`], [`refused`]: rl_check's counts and the subjects it refuses most, in memory.
//! - [`sql`]: the statement texts in `sql/`; [`sql_store`]: the store of both SQL engines.
//! - [`sql_edition`]: the install script of the SQL edition (PL/pgSQL, for managed PostgreSQL).
#![forbid(unsafe_code)]

pub mod args;
pub mod bucket;
pub mod budget;
pub mod call_args;
pub mod calls;
pub mod decision_slot;
pub mod error;
pub mod functions;
pub mod headers;
pub mod json;
pub mod key;
pub mod lease;
pub mod limit_json;
pub mod memory;
pub mod memory_store;
pub mod messages;
pub mod penalty;
pub mod policy;
pub mod policy_cache;
pub mod protocol;
pub mod refused;
pub mod render;
pub mod sql;
pub mod sql_store;
pub mod stats;
pub mod store;
pub mod take_all;
pub mod units;
pub mod window;

pub use args::{Arg, Clock};
pub use calls::Answer;
pub use error::{Error, ErrorKind, Result};
pub use store::{BucketRows, Changed, Store, StoreError, StoreResult, TableRows};
