//! PostgreSQL extension pg_ratelimit: the rl_* functions over the shared core.
//! Glue only: one wrapper per function of the core's table ([`ratelimit_core::functions`]),
//! statements run through SPI with plans prepared once per backend, the core's errors
//! raised with their SQLSTATE. `unsafe` lives in [`ffi`] alone (and in what pgrx's macros
//! expand to).

mod ffi;
mod shared_memory;

use std::cell::{Cell, OnceCell};

use ffi::{JsonbArg, JsonbResult};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PgOid, PostgresGucEnum};
use ratelimit_core::functions::{self as f, Function, SqlType};
use ratelimit_core::memory_store::MemoryStore;
use ratelimit_core::render::ToJson;
use ratelimit_core::sql::{Statement, Value};
use ratelimit_core::sql_store::{SqlEngine, SqlStore};
use ratelimit_core::{calls, Answer, Arg, Clock, ErrorKind, StoreError, StoreResult};

::pgrx::pg_module_magic!(name, version);

pgrx::extension_sql_file!("../../sql/pg_schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../../sql/pg_stats_view.sql", name = "stats_view", requires = [rl_policy_stats]);
pgrx::extension_sql_file!("../../sql/pg_finalize.sql", name = "comments", finalize);

/// An explicit now_ms can refill a bucket early, so only a superuser may allow it.
static ALLOW_EXPLICIT_CLOCK: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Where buckets live. The two homes hold different state, so a role that could switch
/// would escape its limits: only a superuser (or configuration one wrote) may set it.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
enum BucketHome {
    #[name = c"table"]
    Table,
    #[name = c"memory"]
    Memory,
}

static BUCKETS: GucSetting<BucketHome> = GucSetting::<BucketHome>::new(BucketHome::Table);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
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
    shared_memory::init();
    ratelimit_core::stats::install(&shared_memory::COUNTERS);
    ffi::reserve_setting_prefix();
    ffi::watch_policy_changes();
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

/// Runs a function of the core's table with its arguments; raises its error.
fn run<T: FromAnswer>(function: &Function, args: &[Arg]) -> T {
    let clock = Clock::system(ALLOW_EXPLICIT_CLOCK.get());
    let answer = match function.entry {
        // Read on every call, never cached: the setting may change between calls.
        f::Entry::State(call) if call.touches_buckets() && BUCKETS.get() == BucketHome::Memory => {
            let Some(buckets) = shared_memory::table() else {
                raise(ratelimit_core::Error::memory_store_not_loaded(function.name))
            };
            // Budgets go to their tables, each statement with an SPI connection of its own,
            // so a call on buckets alone runs no statement at all.
            let mut store = MemoryStore { buckets, table: SqlStore(PgEngine { client: None }) };
            calls::call(function, &mut store, args, &clock)
        }
        f::Entry::State(_) => with_store(|store| calls::call(function, store, args, &clock)),
        _ => calls::call_without_store(function, args),
    };
    let answer = answer.unwrap_or_else(|e| raise(e));
    // A wrapper whose return type differs from its descriptor's: the catalog test
    // (catalog_matches_the_function_table) catches that before any user could.
    T::from_answer(answer).unwrap_or_else(|other| {
        raise(ratelimit_core::Error::storage(function.name, format!("unexpected answer {other:?}")))
    })
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

/// A jsonb argument as JSON text, read no further than the core's bound on JSON arguments.
fn json_text(function: &Function, name: &str, v: Option<JsonbArg>) -> Option<String> {
    let bound = ratelimit_core::units::MAX_JSON_BYTES;
    v.map(|j| {
        j.text(bound).unwrap_or_else(|bytes| raise(ratelimit_core::args::json_too_large(function.name, name, bytes)))
    })
}

fn text(v: Option<&str>) -> Arg<'_> {
    v.map_or(Arg::Null, Arg::Text)
}

fn real(v: Option<f64>) -> Arg<'static> {
    v.map_or(Arg::Null, Arg::Real)
}

fn int(v: Option<i64>) -> Arg<'static> {
    v.map_or(Arg::Null, Arg::Integer)
}

/// Wrappers of functions that share a signature: rl_take and rl_peek (a bucket), rl_spend
/// and rl_budget (a budget).
macro_rules! wrappers {
    ($($name:ident($key:ident, $second:ident: $second_type:ty, $third:ident) => $descriptor:ident, $second_arg:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name(
            $key: Option<&str>,
            $second: Option<$second_type>,
            $third: Option<f64>,
            cost: default!(Option<f64>, 1),
            now_ms: default!(Option<f64>, "NULL"),
        ) -> JsonbResult {
            run(&f::$descriptor, &[text($key), $second_arg($second), real($third), real(cost), real(now_ms)])
        }
    )*};
}

wrappers! {
    rl_take(key, burst: f64, refill_per_minute) => RL_TAKE, real;
    rl_peek(key, burst: f64, refill_per_minute) => RL_PEEK, real;
    rl_spend(key, period: &str, quota) => RL_SPEND, text;
    rl_budget(key, period: &str, quota) => RL_BUDGET, text;
    rl_window(key, limit: f64, window_seconds) => RL_WINDOW, real;
    rl_window_peek(key, limit: f64, window_seconds) => RL_WINDOW_PEEK, real;
}

/// Wrappers of functions whose arguments are all required but a trailing now_ms; each
/// argument converted to a core value by `text`, `real` or `int`.
macro_rules! now_last_wrappers {
    ($($name:ident($($arg:ident: $t:ty => $to_arg:ident),*) -> $returns:ty = $descriptor:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name($($arg: Option<$t>,)* now_ms: default!(Option<f64>, "NULL")) -> $returns {
            run(&f::$descriptor, &[$($to_arg($arg),)* real(now_ms)])
        }
    )*};
}

now_last_wrappers! {
    rl_refund(key: &str => text, burst: f64 => real, refill_per_minute: f64 => real, amount: f64 => real)
        -> JsonbResult = RL_REFUND;
    rl_charge(key: &str => text, burst: f64 => real, refill_per_minute: f64 => real, amount: f64 => real)
        -> JsonbResult = RL_CHARGE;
    rl_refund_budget(key: &str => text, period: &str => text, amount: f64 => real) -> JsonbResult = RL_REFUND_BUDGET;
    rl_charge_budget(key: &str => text, period: &str => text, amount: f64 => real) -> JsonbResult = RL_CHARGE_BUDGET;
    rl_acquire(key: &str => text, max_in_flight: i64 => int, lease_seconds: f64 => real) -> JsonbResult = RL_ACQUIRE;
    rl_release(key: &str => text, lease: &str => text) -> bool = RL_RELEASE;
    rl_renew(key: &str => text, lease: &str => text, lease_seconds: f64 => real) -> JsonbResult = RL_RENEW;
    rl_in_flight(key: &str => text) -> i64 = RL_IN_FLIGHT;
}

// Only rl_sweep pins its search_path: its statements use IN, whose `=` is found through
// the search_path. Every other function runs statements that qualify every name and
// operator (see ratelimit_core::sql), and saves the cost of switching search_path.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, ratelimit, pg_temp)]
fn rl_sweep(now_ms: default!(Option<f64>, "NULL"), max_rows: default!(Option<i64>, "NULL")) -> i64 {
    run::<i64>(&f::RL_SWEEP, &[real(now_ms), int(max_rows)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_reset(key: Option<&str>) -> i64 {
    run::<i64>(&f::RL_RESET, &[text(key)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_policy_set(name: Option<&str>, definition: Option<JsonbArg>) -> JsonbResult {
    let definition = json_text(&f::RL_POLICY_SET, "definition", definition);
    run(&f::RL_POLICY_SET, &[text(name), text(definition.as_deref())])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_policy_drop(name: Option<&str>) -> bool {
    run(&f::RL_POLICY_DROP, &[text(name)])
}

/// rl_check and rl_refund_check: `(policy, subject [, cost = 1 [, tier [, now_ms]]])`.
macro_rules! policy_wrappers {
    ($($name:ident => $descriptor:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name(
            policy: Option<&str>,
            subject: Option<&str>,
            cost: default!(Option<f64>, 1),
            tier: default!(Option<&str>, "NULL"),
            now_ms: default!(Option<f64>, "NULL"),
        ) -> JsonbResult {
            run(&f::$descriptor, &[text(policy), text(subject), real(cost), text(tier), real(now_ms)])
        }
    )*};
}

policy_wrappers! {
    rl_check => RL_CHECK;
    rl_refund_check => RL_REFUND_CHECK;
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_penalize(
    subject: Option<&str>,
    free_strikes: default!(Option<i64>, 3),
    base_seconds: default!(Option<f64>, 60),
    max_seconds: default!(Option<f64>, 3600),
    window_seconds: default!(Option<f64>, 3600),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbResult {
    let escalation = [int(free_strikes), real(base_seconds), real(max_seconds), real(window_seconds)];
    run(&f::RL_PENALIZE, &[text(subject), escalation[0], escalation[1], escalation[2], escalation[3], real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_block(subject: Option<&str>, seconds: Option<f64>, now_ms: default!(Option<f64>, "NULL")) -> JsonbResult {
    run(&f::RL_BLOCK, &[text(subject), real(seconds), real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_unblock(subject: Option<&str>, now_ms: default!(Option<f64>, "NULL")) -> bool {
    run(&f::RL_UNBLOCK, &[text(subject), real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_take_all(limits: Option<JsonbArg>, now_ms: default!(Option<f64>, "NULL")) -> JsonbResult {
    let limits = json_text(&f::RL_TAKE_ALL, "limits", limits);
    run(&f::RL_TAKE_ALL, &[text(limits.as_deref()), real(now_ms)])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_version() -> String {
    run(&f::RL_VERSION, &[])
}

#[pg_extern(volatile, parallel_safe)]
fn rl_memory_stats() -> JsonbResult {
    match shared_memory::stats() {
        Some(stats) => JsonbResult(stats.to_json()),
        None => raise(ratelimit_core::Error::memory_store_not_loaded(f::RL_MEMORY_STATS.name)),
    }
}

#[pg_extern(volatile, parallel_safe)]
fn rl_policy_stats() -> JsonbResult {
    run(&f::RL_POLICY_STATS, &[])
}

#[pg_extern(volatile, parallel_safe)]
fn rl_stats_reset() -> i64 {
    run(&f::RL_STATS_RESET, &[])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_headers(result: Option<JsonbArg>) -> JsonbResult {
    let result = json_text(&f::RL_HEADERS, "result", result);
    run(&f::RL_HEADERS, &[text(result.as_deref())])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_key(parts: Option<VariadicArray<'_, &str>>) -> String {
    let args: Vec<Arg> = match &parts {
        Some(p) => p.iter().map(text).collect(),
        None => vec![Arg::Null],
    };
    run(&f::RL_KEY, &args)
}

// The internal functions of the guarded UPDATEs (sql/bucket_change.sql,
// sql/budget_change.sql; see ratelimit_core::decision_slot). A high cost keeps the guards
// after the key comparison. Nobody else can call them (no privileges on schema ratelimit),
// and outside those statements they fail.
#[pg_schema]
mod ratelimit {
    use super::{real, run};
    use pgrx::prelude::*;
    use ratelimit_core::functions as f;
    use ratelimit_core::Arg;

    #[pg_extern(volatile, parallel_unsafe, cost = 1000)]
    fn rl_bucket_guard(level: f64, refilled_at: i64, full_at: i64) -> bool {
        run(&f::RL_BUCKET_GUARD, &[real(Some(level)), Arg::Integer(refilled_at), Arg::Integer(full_at)])
    }

    #[pg_extern(volatile, parallel_unsafe, cost = 1000)]
    fn rl_budget_guard(used: i64, resets_at: i64) -> bool {
        run(&f::RL_BUDGET_GUARD, &[Arg::Integer(used), Arg::Integer(resets_at)])
    }

    /// The SET clauses: the row the guard decided to write, column by column.
    macro_rules! decided {
        ($($name:ident -> $t:ty = $descriptor:ident;)*) => {$(
            #[pg_extern(volatile, parallel_unsafe)]
            fn $name() -> $t {
                run(&f::$descriptor, &[])
            }
        )*};
    }

    decided! {
        rl_bucket_new_level -> f64 = RL_BUCKET_NEW_LEVEL;
        rl_bucket_new_refilled_at -> i64 = RL_BUCKET_NEW_REFILLED_AT;
        rl_bucket_new_full_at -> i64 = RL_BUCKET_NEW_FULL_AT;
        rl_budget_new_used -> i64 = RL_BUDGET_NEW_USED;
        rl_budget_new_resets_at -> i64 = RL_BUDGET_NEW_RESETS_AT;
    }
}

thread_local! {
    /// Statements prepared on first use in this backend, each by the function that runs
    /// it, and kept for the backend's lifetime. (So the sweeps, the only statements whose
    /// meaning depends on search_path, are only prepared under rl_sweep's pinned one.)
    static PLANS: [OnceCell<OwnedPreparedStatement>; Statement::ALL.len()] =
        const { [const { OnceCell::new() }; Statement::ALL.len()] };
    /// Whether [`require_updated_objects`] passed in this backend.
    static OBJECTS_CHECKED: Cell<bool> = const { Cell::new(false) };
}

fn oid(t: SqlType) -> PgOid {
    PgOid::BuiltIn(match t {
        SqlType::Text => pg_sys::BuiltinOid::TEXTOID,
        SqlType::Float8 => pg_sys::BuiltinOid::FLOAT8OID,
        SqlType::Int8 => pg_sys::BuiltinOid::INT8OID,
        SqlType::Bool => pg_sys::BuiltinOid::BOOLOID,
        SqlType::Jsonb => pg_sys::BuiltinOid::JSONBOID,
    })
}

fn spi_error(e: pgrx::spi::SpiError) -> StoreError {
    StoreError { message: e.to_string(), engine_code: None }
}

/// After new binaries are installed, the SQL objects stay at the old version until ALTER
/// EXTENSION ... UPDATE; the statements of this library may need objects that are not
/// there yet. Say so, once per backend, rather than fail on a missing function.
fn require_updated_objects(client: &SpiClient<'_>) {
    const LIBRARY: &str = env!("CARGO_PKG_VERSION");
    let installed = client
        .select(
            "SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_ratelimit'",
            Some(1),
            &[],
        )
        .ok()
        .and_then(|t| t.first().get_one::<String>().ok().flatten());
    if let Some(installed) = installed.filter(|v| v != LIBRARY) {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("pg_ratelimit: the library is version {LIBRARY} but the extension in this database is version {installed}"),
            "pg_ratelimit",
        )
        .set_hint("Run ALTER EXTENSION pg_ratelimit UPDATE in this database.")
        .report(PgLogLevel::ERROR);
    }
}

fn check_objects_once(client: &SpiClient<'_>) {
    if !OBJECTS_CHECKED.get() {
        require_updated_objects(client);
        OBJECTS_CHECKED.set(true);
    }
}

/// Runs a call with one SPI connection for all its statements.
fn with_store<T>(call: impl FnOnce(&mut SqlStore<PgEngine>) -> ratelimit_core::Result<T>) -> ratelimit_core::Result<T> {
    Spi::connect_mut(|client| {
        check_objects_once(client);
        call(&mut SqlStore(PgEngine { client: Some(client) }))
    })
}

/// Runs statements through `client`, or, without one, each through an SPI connection of
/// its own.
struct PgEngine<'a, 'conn> {
    client: Option<&'a mut SpiClient<'conn>>,
}

impl PgEngine<'_, '_> {
    fn run<T>(
        &mut self,
        statement: Statement,
        params: &[Value],
        read: impl FnOnce(pgrx::spi::SpiTupleTable) -> pgrx::spi::Result<T>,
    ) -> StoreResult<T> {
        match &mut self.client {
            Some(client) => run_statement(client, statement, params, read),
            None => Spi::connect_mut(|client| {
                check_objects_once(client);
                run_statement(client, statement, params, read)
            }),
        }
    }
}

/// Runs `statement` (prepared on first use, with the types of the values bound to it)
/// and hands its result to `read`.
fn run_statement<T>(
    client: &mut SpiClient<'_>,
    statement: Statement,
    params: &[Value],
    read: impl FnOnce(pgrx::spi::SpiTupleTable) -> pgrx::spi::Result<T>,
) -> StoreResult<T> {
    PLANS.with(|plans| {
        let cell = &plans[statement as usize];
        if cell.get().is_none() {
            let types: Vec<PgOid> = params.iter().map(|v| oid(v.sql_type())).collect();
            // prepare_mut: every statement takes a fresh snapshot, so a re-read sees the latest row.
            let plan = client.prepare_mut(statement.text(), &types).map_err(spi_error)?;
            let _ = cell.set(plan.keep());
        }
        let plan = cell.get().expect("prepared above");
        let args: Vec<pgrx::datum::DatumWithOid> = params
            .iter()
            .map(|v| match v {
                Value::Text(t) => (*t).into(),
                Value::String(t) => t.as_str().into(),
                Value::Float(f) => (*f).into(),
                Value::Int(i) => (*i).into(),
            })
            .collect();
        // select, not update: pgrx's update first forces a transaction id on the caller
        // (GetCurrentTransactionId), which a standby refuses and which would make every
        // refusal and peek commit a transaction. A plan prepared with prepare_mut still runs
        // read-write (a fresh snapshot each time); the UPDATE takes an id when it writes.
        client.select(plan, None, &args).and_then(read).map_err(spi_error)
    })
}

impl SqlEngine for PgEngine<'_, '_> {
    const LOCKS_ROWS: bool = true;

    fn read_only(&mut self) -> StoreResult<bool> {
        Ok(ffi::transaction_is_read_only())
    }

    fn execute(&mut self, statement: Statement, params: &[Value]) -> StoreResult<u64> {
        self.run(statement, params, |t| Ok(t.len() as u64))
    }

    fn query_row(&mut self, statement: Statement, params: &[Value]) -> StoreResult<Option<Vec<Value<'static>>>> {
        Ok(self.query_rows(statement, params)?.into_iter().next())
    }

    /// A call already runs inside the caller's transaction, which makes it one unit.
    fn begin_unit(&mut self) -> StoreResult<bool> {
        Ok(false)
    }

    fn end_unit(&mut self, _owned: bool, _commit: bool) -> StoreResult<()> {
        Ok(())
    }

    fn query_rows(&mut self, statement: Statement, params: &[Value]) -> StoreResult<Vec<Vec<Value<'static>>>> {
        let columns = statement.columns();
        self.run(statement, params, |table| {
            table
                .map(|row| {
                    (0..columns.len())
                        .map(|i| match columns[i] {
                            SqlType::Float8 => row.get::<f64>(i + 1).map(|v| Value::Float(v.unwrap_or(0.0))),
                            SqlType::Text => row.get::<String>(i + 1).map(|v| Value::String(v.unwrap_or_default())),
                            _ => row.get::<i64>(i + 1).map(|v| Value::Int(v.unwrap_or(0))),
                        })
                        .collect::<pgrx::spi::Result<Vec<_>>>()
                })
                .collect()
        })
    }

    const CHECKS_EPOCH_IN_MEMORY: bool = true;

    fn checks_epoch(&mut self) -> Option<u64> {
        ffi::checks_epoch()
    }

    fn runs_guarded_updates(&mut self) -> StoreResult<bool> {
        let sharded = || {
            let query = "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid \
                         OPERATOR(pg_catalog.=) ANY (ARRAY['ratelimit.rl_bucket'::pg_catalog.regclass, \
                         'ratelimit.rl_budget'::pg_catalog.regclass]))";
            Spi::get_one::<bool>(query).map(|b| b.unwrap_or(false)).map_err(|e| e.to_string())
        };
        ffi::state_is_distributed(sharded)
            .map(|distributed| !distributed)
            .map_err(|message| StoreError { message, engine_code: None })
    }

    fn checks_changed(&mut self) -> StoreResult<()> {
        ffi::checks_changed();
        Ok(())
    }
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
