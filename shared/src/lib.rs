//! The engine-free core of pg_ratelimit / sqlite ratelimit.
//!
//! Every rule lives here; the engine crates only convert values, run statements and
//! return answers. The source is grouped by role, and each module is re-exported at the
//! root (`crate::bucket`, `crate::store`), so a path says what, the tree says where:
//! - `kinds/`: [`bucket`], [`budget`], [`window`], [`lease`], the arithmetic of each kind of
//!   limit, pure; [`take_all`], several at once, all or nothing; [`limit_json`], the one
//!   parser of limit objects (rl_take_all's items, policies' limits).
//! - `policies/`: [`policy`] (definitions, tiers, derived keys), [`policy_cache`] (what a
//!   connection remembers between checks), [`penalty`] (strikes and blocks).
//! - `surface/`: [`units`] (units, ranges, calendar periods; the leaf), [`functions`] (every
//!   SQL function described once), [`calls`] (what each one runs), [`args`] and
//!   [`call_args`] (engine values read and checked), [`error`], [`messages`] (every error
//!   text), [`render`] (answers as JSON), [`json`], [`headers`], [`key`].
//! - `storage/`: [`store`] (the seam an engine implements), [`protocol`] (the flows that
//!   make each call atomic over it), [`decision_slot`] (how one SQL statement reaches a
//!   call's decision), [`sql`] (the statement texts in `sql/`), [`sql_store`] (the store of
//!   both SQL engines), [`memory`] and [`memory_store`] (the memory store's table of
//!   buckets, pure, and the store over it).
//! - `observe/`: [`stats`], [`refused`]: rl_check's counts and the subjects it refuses
//!   most, in memory.
//!
//! What is generated from the function table (the SQL edition, privileges, the reference)
//! is the crate `ratelimit_codegen` (`codegen/`), which no engine links.
#![forbid(unsafe_code)]

mod kinds;
mod observe;
mod policies;
mod storage;
mod surface;

pub use kinds::{bucket, budget, kind, lease, limit_json, period, take_all, window};
pub use observe::{refused, stats};
pub use policies::{penalty, policy, policy_cache};
pub use storage::{decision_slot, memory, memory_store, protocol, sql, sql_store, store};
pub use surface::{args, call_args, calls, error, functions, headers, json, key, messages, render, units};

pub use args::{Arg, Clock};
pub use calls::Answer;
pub use error::{Error, ErrorKind, Result};
pub use store::{BucketRows, Changed, Store, StoreError, StoreResult, TableRows};
