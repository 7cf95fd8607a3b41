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
}

/// An error whose text starts with the SQL function's name, in lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub function: &'static str,
    pub message: String,
    /// The engine's own error code for a Storage error (e.g. SQLITE_BUSY), kept so the
    /// caller's driver still sees what kind of failure it was.
    pub engine_code: Option<i32>,
}

impl Error {
    pub fn invalid(function: &'static str, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::InvalidArgument, function, message: message.into(), engine_code: None }
    }

    pub fn out_of_range(function: &'static str, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::OutOfRange, function, message: message.into(), engine_code: None }
    }

    pub fn storage(function: &'static str, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Storage, function, message: message.into(), engine_code: None }
    }

    pub fn not_in_statement(function: &'static str, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::NotInStatement, function, message: message.into(), engine_code: None }
    }

    pub fn memory_store_not_loaded(function: &'static str) -> Self {
        Error {
            kind: ErrorKind::MemoryStoreNotLoaded,
            function,
            message: "the memory store is not loaded: add pg_ratelimit to shared_preload_libraries and restart \
                      the server, or set pg_ratelimit.buckets to 'table'"
                .into(),
            engine_code: None,
        }
    }

    pub fn read_only(function: &'static str) -> Self {
        Error {
            kind: ErrorKind::ReadOnly,
            function,
            message: "cannot change rate-limit state in a read-only database or transaction".into(),
            engine_code: None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.function, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
