//! How a call reaches the core and its answer or error comes back: [`run`] runs a
//! function of the core's table over the store the function and the settings ask for (the
//! table store through SPI, or the memory store), and raises the core's errors with the
//! SQLSTATE of their kind; an error PostgreSQL raises inside a call keeps its SQLSTATE and
//! gains the function's name.

use crate::jsonb::JsonbResult;
use crate::settings::{BucketHome, ALLOW_EXPLICIT_CLOCK, BUCKETS};
use crate::shared_memory;
use crate::spi::{with_store, PgEngine};
use pgrx::prelude::*;
use ratelimit_core::functions::{self as f, Function};
use ratelimit_core::memory_store::MemoryStore;
use ratelimit_core::sql_store::SqlStore;
use ratelimit_core::{calls, Answer, Arg, Clock, ErrorKind};

/// Raises a core error as a PostgreSQL ERROR with the SQLSTATE its kind calls for.
pub(crate) fn raise(e: ratelimit_core::Error) -> ! {
    let code = match e.kind {
        ErrorKind::InvalidArgument => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        ErrorKind::ClockNotAllowed => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        ErrorKind::ReadOnly => PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        ErrorKind::NotInStatement | ErrorKind::MemoryStoreNotLoaded => {
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        }
        ErrorKind::LimitExceeded => PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        ErrorKind::OutOfRange => PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        ErrorKind::Storage => PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        ErrorKind::UnknownPolicy => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
    };
    ereport!(ERROR, code, e.to_string());
}

/// Runs a function of the core's table with its arguments; raises its error. An error
/// PostgreSQL raises inside the call (a full disk, a lock or statement timeout, a
/// serialization failure) keeps its SQLSTATE and gains the function's name.
pub(crate) fn run<T: FromAnswer>(function: &Function, args: &[Arg]) -> T {
    // catch_unwind rather than PgTryBuilder: nothing to allocate on the path without an error
    let answer = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer_of(function, args))) {
        Ok(answer) => answer,
        Err(payload) => match payload.downcast::<pg_sys::panic::CaughtError>() {
            Ok(caught) => match *caught {
                pg_sys::panic::CaughtError::PostgresError(e) => raise_named(function.name, &e),
                other => other.rethrow(),
            },
            Err(payload) => std::panic::resume_unwind(payload),
        },
    };
    let answer = answer.unwrap_or_else(|e| raise(e));
    // A wrapper whose return type differs from its descriptor's: the catalog test
    // (catalog_matches_the_function_table) catches that before any user could.
    T::from_answer(answer).unwrap_or_else(|other| {
        raise(ratelimit_core::Error::storage(format!("unexpected answer {other:?}")).in_function(function.name))
    })
}

/// Raises an error PostgreSQL raised inside the call again, its message prefixed with the
/// function's name.
fn raise_named(name: &str, e: &pg_sys::panic::ErrorReportWithLevel) -> ! {
    let mut named = pg_sys::panic::ErrorReport::new(e.sql_error_code(), format!("{name}: {}", e.message()), "");
    if let Some(detail) = e.detail() {
        named = named.set_detail(detail);
    }
    if let Some(hint) = e.hint() {
        named = named.set_hint(hint);
    }
    named.report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// The core's answer to a call, over the store the function and settings ask for.
fn answer_of(function: &Function, args: &[Arg]) -> ratelimit_core::Result<Answer> {
    let clock = Clock::system(ALLOW_EXPLICIT_CLOCK.get());
    match function.entry {
        // Read on every call, never cached: the setting may change between calls.
        f::Entry::State(call) if call.touches_buckets() && BUCKETS.get() == BucketHome::Memory => {
            let Some(buckets) = shared_memory::table() else {
                return Err(ratelimit_core::Error::memory_store_not_loaded().in_function(function.name));
            };
            // Budgets go to their tables, each statement with an SPI connection of its own,
            // so a call on buckets alone runs no statement at all.
            let mut store = MemoryStore { buckets, table: SqlStore(PgEngine { client: None }) };
            calls::call(function, &mut store, args, &clock)
        }
        f::Entry::State(_) => with_store(|store| calls::call(function, store, args, &clock)),
        _ => calls::call_without_store(function, args),
    }
}

/// The Rust type a wrapper returns, from the core's answer.
pub(crate) trait FromAnswer: Sized {
    /// The value, or the answer back when it is of another kind.
    fn from_answer(a: Answer) -> Result<Self, Answer>;
}

macro_rules! from_answer {
    ($($t:ty => $variant:ident($v:ident) => $value:expr;)*) => {$(
        impl FromAnswer for $t {
            fn from_answer(a: Answer) -> Result<Self, Answer> {
                if let Answer::$variant($v) = a { Ok($value) } else { Err(a) }
            }
        }
    )*};
}

from_answer! {
    JsonbResult => Json(j) => JsonbResult(j);
    String => Text(t) => t;
    i64 => Int(n) => n;
    f64 => Real(r) => r;
    bool => Bool(b) => b;
}
