//! The one error type every rule reports, and how its text reads.

use std::fmt;

/// What went wrong, so each engine can pick its own error code (PostgreSQL SQLSTATE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad argument: PostgreSQL 22023 invalid_parameter_value.
    InvalidArgument,
    /// An explicit clock while the engine forbids it: PostgreSQL 42501 insufficient_privilege.
    ClockNotAllowed,
    /// A state-changing call on a read-only database or transaction: PostgreSQL 25006.
    ReadOnly,
    /// The engine failed to run a statement (locked database, I/O error, ...).
    Storage,
    /// An internal function called outside the extension's own statements: PostgreSQL 55000.
    NotInStatement,
    /// A call would store more than a key may hold: PostgreSQL 54000 program_limit_exceeded.
    LimitExceeded,
    /// A result beyond the range a count can be kept or shown exactly in: PostgreSQL 22003
    /// numeric_value_out_of_range.
    OutOfRange,
    /// The memory store is chosen but the server did not load it at start: PostgreSQL 55000.
    MemoryStoreNotLoaded,
    /// A check of a policy that does not exist: PostgreSQL 42704 undefined_object (SQLite,
    /// which has no SQLSTATE: the message's stable start, "<function>: there is no policy
    /// named"), so that callers tell it from a bad argument by its code.
    UnknownPolicy,
}

/// An error whose text starts with the SQL function's name, in lower case. Rules build it
/// without the name; [`crate::calls::call`] stamps the called function's name on it once
/// ([`Error::in_function`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// The SQL function the error is reported by ("" until the call stamps it).
    pub function: &'static str,
    pub message: String,
    /// The engine's own error code for a Storage error (e.g. SQLITE_BUSY), kept so the
    /// caller's driver still sees what kind of failure it was.
    pub engine_code: Option<i32>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, function: "", message: message.into(), engine_code: None }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    pub fn unknown_policy(name: &str) -> Self {
        Error::new(ErrorKind::UnknownPolicy, crate::messages::NO_POLICY.render(&[&name]))
    }

    pub fn out_of_range(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::OutOfRange, message)
    }

    pub fn storage(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Storage, message)
    }

    pub fn not_in_statement(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotInStatement, message)
    }

    pub fn memory_store_not_loaded() -> Self {
        Error::new(
            ErrorKind::MemoryStoreNotLoaded,
            "the memory store is not loaded: add pg_ratelimit to shared_preload_libraries and restart the server, \
             or set pg_ratelimit.buckets to 'table'",
        )
    }

    pub fn read_only() -> Self {
        Error::new(ErrorKind::ReadOnly, crate::messages::READ_ONLY.template)
    }

    /// The error as `function` reports it (an error already stamped keeps its name).
    #[must_use]
    pub fn in_function(mut self, function: &'static str) -> Self {
        if self.function.is_empty() {
            self.function = function;
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.function, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
