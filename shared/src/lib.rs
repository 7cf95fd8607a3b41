//! The engine-free core of pg_ratelimit / sqlite ratelimit.
//!
//! Every rule lives here: argument validation and error texts ([`args`]), token bucket
//! arithmetic ([`bucket`]), calendar budgets ([`budget`]), key encoding ([`key`]), and the
//! atomic read-modify-write protocol an engine runs through [`store::StateStore`]. The
//! engine crates only convert values, run statements and return JSON. [`calls`] is the
//! whole SQL surface, one function per SQL function.

pub mod args;
pub mod bucket;
pub mod budget;
pub mod calls;
pub mod error;
pub mod guard;
pub mod headers;
pub mod json;
pub mod key;
pub mod multi;
pub mod sql;
pub mod store;

pub use args::{Arg, Clock};
pub use error::{Error, ErrorKind, Result};
pub use store::{StateStore, StoreError, StoreResult};
