//! PostgreSQL extension pg_ratelimit: the rl_* functions over the shared core.
//! Glue only, one module per subject: [`wrappers`] declares one SQL function per entry of
//! the core's table ([`ratelimit_core::functions`]) and hands its arguments to [`run`];
//! [`spi`] runs the core's statements through SPI with plans prepared once per backend;
//! [`jsonb`] turns answers into `jsonb` and reads `jsonb` arguments within a bound;
//! [`invalidation`] follows policy changes and Citus's distribution through the relcache;
//! [`shared_memory`] is the memory store; [`heap_change`] changes the table store's bucket
//! rows without a statement; [`settings`] the `pg_ratelimit.*` settings;
//! [`citus_guard`] keeps calls in shapes that crash Citus's delegation from reaching it.
//! The core's errors are raised with their SQLSTATE. `unsafe` is denied by the workspace
//! and allowed, with the reason, in `jsonb`, `invalidation`, `shared_memory`, `heap_change`,
//! `citus_guard`, and one function each of `settings` and `spi` (and in what pgrx's macros
//! expand to).

mod citus_guard;
mod heap_change;
mod invalidation;
mod jsonb;
mod settings;
mod shared_memory;
mod spi;
mod wrappers;

use jsonb::JsonbResult;
use pgrx::prelude::*;
use ratelimit_core::functions::{self as f, Function};
use ratelimit_core::memory_store::MemoryStore;
use ratelimit_core::sql_store::SqlStore;
use ratelimit_core::{calls, Answer, Arg, Clock, ErrorKind};
use settings::{BucketHome, ALLOW_EXPLICIT_CLOCK, BUCKETS};
use spi::{with_store, PgEngine};

::pgrx::pg_module_magic!(name, version);

pgrx::extension_sql_file!("../../sql/pg_schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../../sql/pg_stats_view.sql", name = "stats_view", requires = [wrappers::rl_policy_stats]);
pgrx::extension_sql_file!("../../sql/pg_finalize.sql", name = "comments", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::define();
    shared_memory::init();
    ratelimit_core::stats::install(&shared_memory::COUNTERS);
    settings::reserve_prefix();
    invalidation::watch_policy_changes();
    citus_guard::install();
}

/// Raises a core error as a PostgreSQL ERROR with the SQLSTATE its kind calls for.
fn raise(e: ratelimit_core::Error) -> ! {
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
    };
    ereport!(ERROR, code, e.to_string());
}

/// Runs a function of the core's table with its arguments; raises its error. An error
/// PostgreSQL raises inside the call (a full disk, a lock or statement timeout, a
/// serialization failure) keeps its SQLSTATE and gains the function's name.
fn run<T: FromAnswer>(function: &Function, args: &[Arg]) -> T {
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
trait FromAnswer: Sized {
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

/// In-server tests (cargo pgrx test): the contract through SPI, with SQLSTATEs.
#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::JsonB;

    fn json(sql: &str) -> serde_json::Value {
        Spi::get_one::<JsonB>(sql).expect("query runs").expect("never NULL").0
    }

    fn explicit_clock() {
        Spi::run("SET pg_ratelimit.allow_explicit_clock = on").unwrap();
    }

    #[pg_test]
    fn contract_example_burst_3_refill_60() {
        explicit_clock();
        // (now_ms, admitted, remaining, retry_after_ms)
        for (now, admitted, remaining, retry) in [
            (0, true, 2, 0),
            (0, true, 1, 0),
            (0, true, 0, 0),
            (0, false, 0, 1000),
            (999, false, 0, 1),
            (1000, true, 0, 0),
        ] {
            let r = json(&format!("SELECT rl_take('a', 3, 60, 1, {now})"));
            assert_eq!(r["admitted"], admitted, "{now}: {r}");
            assert_eq!(r["remaining"], remaining, "{now}: {r}");
            assert_eq!(r["retry_after_ms"], retry, "{now}: {r}");
        }
        assert_eq!(json("SELECT rl_take('b', 3, 60, 1, 0)")["remaining"], 2);
    }

    #[pg_test]
    fn budgets_are_exact_and_peek_spends_nothing() {
        explicit_clock();
        for _ in 0..10 {
            assert_eq!(json("SELECT rl_spend('k', 'day', 1, 0.1, 0)")["admitted"], true);
        }
        let peek = json("SELECT rl_budget('k', 'day', 1, 0.1, 0)");
        assert_eq!(
            peek,
            serde_json::json!({"admitted": false, "used": 1, "limit": 1, "remaining": 0, "resets_at": 86400,
                               "retry_after_seconds": 86400, "exceeds_limit": false, "period_seconds": 86400})
        );
        assert_eq!(json("SELECT rl_spend('k', 'month', 1, 1, 0)")["admitted"], true, "periods are separate");
    }

    #[pg_test]
    fn sweep_removes_only_finished_rows() {
        explicit_clock();
        json("SELECT rl_take('s', 2, 60, 2, 0)");
        assert_eq!(Spi::get_one::<i64>("SELECT rl_sweep(1999)").unwrap(), Some(0));
        assert_eq!(Spi::get_one::<i64>("SELECT rl_sweep(2000)").unwrap(), Some(1));
    }

    #[pg_test]
    fn take_all_charges_all_or_nothing() {
        explicit_clock();
        let limits =
            r#"'[{"key": "u", "burst": 1, "refill_per_minute": 1}, {"key": "u", "period": "day", "quota": 2}]'"#;
        assert_eq!(json(&format!("SELECT rl_take_all({limits}, 0)"))["admitted"], true);
        let refused = json(&format!("SELECT rl_take_all({limits}, 0)"));
        assert_eq!(refused["admitted"], false);
        assert_eq!(refused["items"][1]["admitted"], true, "the budget alone would admit");
        assert_eq!(json("SELECT rl_budget('u', 'day', 2, 1, 0)")["used"], 2, "but it was not charged");
        assert_eq!(Spi::get_one::<i64>("SELECT rl_reset('u')").unwrap(), Some(2));
    }

    #[pg_test]
    fn headers_from_a_refusal_never_say_retry_after_0() {
        explicit_clock();
        json("SELECT rl_take('h', 1, 60, 1, 0)");
        let headers = json("SELECT rl_headers(rl_take('h', 1, 60, 1, 999))");
        assert_eq!(headers["Retry-After"], "1");
        assert_eq!(headers["RateLimit"], r#""bucket";r=0;t=1"#);
    }

    /// Each bad input's message and SQLSTATE are asserted once, in the client suite's
    /// conformance list (tests/test_conformance.py), on both engines; here, that a caught
    /// error inside a SECURITY DEFINER call aborts its transaction like any other.
    #[pg_test(error = "rl_take: burst must be a finite number greater than 0, got 0")]
    fn a_bad_argument_is_an_error() {
        explicit_clock();
        Spi::run("SELECT rl_take('k', 0, 60)").unwrap();
    }

    /// A boolean as concat_ws shows it.
    fn pg_bool(b: bool) -> String {
        (if b { "t" } else { "f" }).to_owned()
    }

    /// Every function as installed (signature with defaults, result, volatility, parallel
    /// safety, SECURITY DEFINER, schema, PUBLIC's EXECUTE, comment) is what the core's table
    /// says, and the extension has no function the table lacks.
    #[pg_test]
    fn catalog_matches_the_function_table() {
        use ratelimit_core::functions::{Entry, ALL};
        for f in ALL {
            let row = Spi::get_one::<String>(&format!(
                "SELECT concat_ws(' | ', pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
                        p.provolatile, p.proparallel, p.prosecdef, n.nspname = 'ratelimit',
                        has_function_privilege('public', p.oid, 'EXECUTE'), obj_description(p.oid, 'pg_proc'))
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE p.proname = '{}' AND n.nspname <> 'tests'",
                f.name
            ))
            .unwrap()
            .unwrap_or_else(|| panic!("{} is not installed", f.name));
            let (volatility, parallel, definer, internal, public) = match f.entry {
                Entry::State(_) => ("v", "u", true, false, !f.admin_only),
                Entry::Pure(_) => ("i", "s", false, false, true),
                Entry::Internal(_) => ("v", "u", false, true, false),
                Entry::Server => ("v", "s", false, false, true),
                Entry::Process(_) => ("v", "s", false, false, !f.admin_only),
            };
            let expected = [
                f.pg_arguments(),
                f.returns.pg_name().to_owned(),
                volatility.to_owned(),
                parallel.to_owned(),
                pg_bool(definer),
                pg_bool(internal),
                pg_bool(public),
                f.comment.to_owned(),
            ]
            .join(" | ");
            assert_eq!(row, expected, "{}", f.name);
        }
        let installed = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
             JOIN pg_extension e ON e.oid = d.refobjid JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE e.extname = 'pg_ratelimit' AND n.nspname <> 'tests'",
        );
        assert_eq!(installed, Ok(Some(ALL.len() as i64)));
    }

    #[pg_test(error = "rl_take: an explicit now_ms is not allowed unless pg_ratelimit.allow_explicit_clock is on")]
    fn explicit_clock_is_refused_by_default() {
        Spi::run("SELECT rl_take('k', 3, 60, 1, 0)").unwrap();
    }
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
