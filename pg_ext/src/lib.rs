//! PostgreSQL extension pg_ratelimit: the rl_* functions over the shared core.
//! Glue only: convert arguments, run the core's statements through SPI with plans
//! prepared once per backend, raise the core's errors with their SQLSTATE.

use std::cell::{Cell, OnceCell};

use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, IntoDatum, JsonB, PgOid};
use ratelimit_core::bucket::BucketState;
use ratelimit_core::budget::{BudgetState, Period};
use ratelimit_core::guard::{self, Change};
use ratelimit_core::sql::Statement;
use ratelimit_core::{calls, Arg, Clock, ErrorKind, StateStore, StoreError, StoreResult};

::pgrx::pg_module_magic!(name, version);

pgrx::extension_sql_file!("../../sql/pg_schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../../sql/pg_finalize.sql", name = "comments", finalize);

/// An explicit now_ms can refill a bucket early, so only a superuser may allow it.
static ALLOW_EXPLICIT_CLOCK: GucSetting<bool> = GucSetting::<bool>::new(false);

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
}

fn clock() -> Clock {
    Clock::system(ALLOW_EXPLICIT_CLOCK.get())
}

/// Raises a core error as a PostgreSQL ERROR with the SQLSTATE its kind calls for.
fn raise(e: ratelimit_core::Error) -> ! {
    let code = match e.kind {
        ErrorKind::InvalidArgument => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        ErrorKind::ClockNotAllowed => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        ErrorKind::ReadOnly => PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        ErrorKind::Storage => PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
    };
    ereport!(ERROR, code, e.to_string());
}

/// Runs a core call that answers in JSON; raises its error.
fn answer(
    call: impl FnOnce(&mut PgStore, &[Arg], &Clock) -> ratelimit_core::Result<String>,
    args: &[Arg],
) -> JsonbText {
    with_store(|store| call(store, args, &clock())).map(JsonbText).unwrap_or_else(|e| raise(e))
}

/// A result the core already wrote as JSON text, returned as `jsonb` by PostgreSQL's own
/// parser (no detour through a JSON value tree).
pub struct JsonbText(String);

impl IntoDatum for JsonbText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let text = std::ffi::CString::new(self.0).expect("the core writes no NUL into JSON");
        // SAFETY: jsonb_in reads a NUL-terminated string and returns a palloc'd jsonb.
        unsafe { pgrx::direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())]) }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

unsafe impl pgrx::callconv::BoxRet for JsonbText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

unsafe impl SqlTranslatable for JsonbText {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbText);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

fn text(v: Option<&str>) -> Arg<'_> {
    v.map_or(Arg::Null, Arg::Text)
}

fn real(v: Option<f64>) -> Arg<'static> {
    v.map_or(Arg::Null, Arg::Real)
}

#[pg_extern(name = "rl_take", volatile, parallel_unsafe, security_definer)]
fn rl_take(
    key: Option<&str>,
    burst: Option<f64>,
    refill_per_minute: Option<f64>,
    cost: default!(Option<f64>, 1),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbText {
    answer(
        |s, a, c| calls::rl_take(s, a, c),
        &[text(key), real(burst), real(refill_per_minute), real(cost), real(now_ms)],
    )
}

#[pg_extern(name = "rl_spend", volatile, parallel_unsafe, security_definer)]
fn rl_spend(
    key: Option<&str>,
    period: Option<&str>,
    quota: Option<f64>,
    cost: default!(Option<f64>, 1),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbText {
    answer(|s, a, c| calls::rl_spend(s, a, c), &[text(key), text(period), real(quota), real(cost), real(now_ms)])
}

#[pg_extern(name = "rl_budget", volatile, parallel_unsafe, security_definer)]
fn rl_budget(
    key: Option<&str>,
    period: Option<&str>,
    quota: Option<f64>,
    cost: default!(Option<f64>, 1),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbText {
    answer(|s, a, c| calls::rl_budget(s, a, c), &[text(key), text(period), real(quota), real(cost), real(now_ms)])
}

// Only rl_sweep pins its search_path: its statements use IN, whose `=` is found through
// the search_path. Every other function runs statements that qualify every name and
// operator (see ratelimit_core::sql), and saves the cost of switching search_path.
#[pg_extern(name = "rl_sweep", volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, ratelimit, pg_temp)]
fn rl_sweep(now_ms: default!(Option<f64>, "NULL"), max_rows: default!(Option<i64>, "NULL")) -> i64 {
    let args = [real(now_ms), max_rows.map_or(Arg::Null, Arg::Integer)];
    with_store(|store| calls::rl_sweep(store, &args, &clock())).unwrap_or_else(|e| raise(e))
}

#[pg_extern(name = "rl_peek", volatile, parallel_unsafe, security_definer)]
fn rl_peek(
    key: Option<&str>,
    burst: Option<f64>,
    refill_per_minute: Option<f64>,
    cost: default!(Option<f64>, 1),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbText {
    answer(
        |s, a, c| calls::rl_peek(s, a, c),
        &[text(key), real(burst), real(refill_per_minute), real(cost), real(now_ms)],
    )
}

#[pg_extern(name = "rl_refund", volatile, parallel_unsafe, security_definer)]
fn rl_refund(
    key: Option<&str>,
    burst: Option<f64>,
    refill_per_minute: Option<f64>,
    amount: Option<f64>,
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbText {
    answer(
        |s, a, c| calls::rl_refund(s, a, c),
        &[text(key), real(burst), real(refill_per_minute), real(amount), real(now_ms)],
    )
}

#[pg_extern(name = "rl_refund_budget", volatile, parallel_unsafe, security_definer)]
fn rl_refund_budget(
    key: Option<&str>,
    period: Option<&str>,
    amount: Option<f64>,
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbText {
    answer(|s, a, c| calls::rl_refund_budget(s, a, c), &[text(key), text(period), real(amount), real(now_ms)])
}

#[pg_extern(name = "rl_reset", volatile, parallel_unsafe, security_definer)]
fn rl_reset(key: Option<&str>) -> i64 {
    with_store(|store| calls::rl_reset(store, &[text(key)])).unwrap_or_else(|e| raise(e))
}

#[pg_extern(name = "rl_take_all", volatile, parallel_unsafe, security_definer)]
fn rl_take_all(limits: Option<JsonB>, now_ms: default!(Option<f64>, "NULL")) -> JsonbText {
    let limits = limits.map(|j| j.0.to_string());
    answer(|s, a, c| calls::rl_take_all(s, a, c), &[text(limits.as_deref()), real(now_ms)])
}

#[pg_extern(name = "rl_headers", immutable, parallel_safe)]
fn rl_headers(result: Option<JsonB>) -> JsonbText {
    let result = result.map(|j| j.0.to_string());
    calls::rl_headers(&[text(result.as_deref())]).map(JsonbText).unwrap_or_else(|e| raise(e))
}

#[pg_extern(name = "rl_key", immutable, parallel_safe)]
fn rl_key(parts: Option<VariadicArray<'_, &str>>) -> String {
    let args: Vec<Arg> = match &parts {
        Some(p) => p.iter().map(text).collect(),
        None => vec![Arg::Null],
    };
    calls::rl_key(&args).unwrap_or_else(|e| raise(e))
}

// The guarded UPDATEs (sql/bucket_change.sql, sql/budget_change.sql) call these: the
// WHERE clause hands the row to the decision of the call in progress, the SET clause
// reads the row it decided on. A high cost keeps them after the key comparison. Nobody
// else can call them (no privileges on schema ratelimit), and outside those statements
// they fail.

#[pg_schema]
mod ratelimit {
    use pgrx::prelude::*;
    use ratelimit_core::bucket::BucketState;
    use ratelimit_core::budget::BudgetState;
    use ratelimit_core::guard::{self, NotInStatement};

    fn inside_statement<T>(r: Result<T, NotInStatement>) -> T {
        match r {
            Ok(value) => value,
            Err(e) => {
                ereport!(ERROR, PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, e.to_string());
            }
        }
    }

    #[pg_extern(volatile, parallel_unsafe, cost = 1000)]
    fn rl_bucket_guard(level: f64, refilled_at: i64, full_at: i64) -> bool {
        inside_statement(guard::guard(&guard::BUCKET, &BucketState { level, refilled_at, full_at }))
    }

    #[pg_extern(volatile, parallel_unsafe)]
    fn rl_bucket_new_level() -> f64 {
        inside_statement(guard::new_row(&guard::BUCKET)).level
    }

    #[pg_extern(volatile, parallel_unsafe)]
    fn rl_bucket_new_refilled_at() -> i64 {
        inside_statement(guard::new_row(&guard::BUCKET)).refilled_at
    }

    #[pg_extern(volatile, parallel_unsafe)]
    fn rl_bucket_new_full_at() -> i64 {
        inside_statement(guard::new_row(&guard::BUCKET)).full_at
    }

    #[pg_extern(volatile, parallel_unsafe, cost = 1000)]
    fn rl_budget_guard(used: i64, resets_at: i64) -> bool {
        inside_statement(guard::guard(&guard::BUDGET, &BudgetState { used, resets_at }))
    }

    #[pg_extern(volatile, parallel_unsafe)]
    fn rl_budget_new_used() -> i64 {
        inside_statement(guard::new_row(&guard::BUDGET)).used
    }

    #[pg_extern(volatile, parallel_unsafe)]
    fn rl_budget_new_resets_at() -> i64 {
        inside_statement(guard::new_row(&guard::BUDGET)).resets_at
    }
}

thread_local! {
    /// Statements prepared on first use in this backend, each by the function that runs
    /// it, and kept for the backend's lifetime. (So the sweeps, the only statements whose
    /// meaning depends on search_path, are only prepared under rl_sweep's pinned one.)
    static PLANS: [OnceCell<OwnedPreparedStatement>; Statement::ALL.len()] = const { [const { OnceCell::new() }; Statement::ALL.len()] };
    /// Whether [`require_updated_objects`] passed in this backend.
    static OBJECTS_CHECKED: Cell<bool> = const { Cell::new(false) };
}

const TEXT: PgOid = PgOid::BuiltIn(pg_sys::BuiltinOid::TEXTOID);
const FLOAT8: PgOid = PgOid::BuiltIn(pg_sys::BuiltinOid::FLOAT8OID);
const INT8: PgOid = PgOid::BuiltIn(pg_sys::BuiltinOid::INT8OID);

fn parameter_types(statement: Statement) -> &'static [PgOid] {
    match statement {
        Statement::BucketRead | Statement::BucketLock | Statement::BucketChange => &[TEXT],
        Statement::BucketInsert => &[TEXT, FLOAT8, INT8, INT8],
        Statement::BucketUpdate => &[FLOAT8, INT8, INT8, TEXT, FLOAT8, INT8],
        Statement::BudgetRead | Statement::BudgetLock | Statement::BudgetChange => &[TEXT, TEXT],
        Statement::BudgetInsert => &[TEXT, TEXT, INT8, INT8],
        Statement::BudgetUpdate => &[INT8, INT8, TEXT, TEXT, INT8, INT8],
        Statement::SweepBuckets | Statement::SweepBudgets => &[INT8, INT8],
        Statement::ResetBuckets | Statement::ResetBudgets => &[TEXT],
    }
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

/// Runs a call with an SPI connection.
fn with_store<T>(call: impl FnOnce(&mut PgStore) -> ratelimit_core::Result<T>) -> ratelimit_core::Result<T> {
    Spi::connect_mut(|client| {
        if !OBJECTS_CHECKED.get() {
            require_updated_objects(client);
            OBJECTS_CHECKED.set(true);
        }
        call(&mut PgStore { client })
    })
}

struct PgStore<'a, 'conn> {
    client: &'a mut SpiClient<'conn>,
}

impl PgStore<'_, '_> {
    /// Runs `statement` (prepared on first use) and hands its result to `read`.
    fn run<T>(
        &mut self,
        statement: Statement,
        args: &[pgrx::datum::DatumWithOid],
        read: impl FnOnce(pgrx::spi::SpiTupleTable) -> pgrx::spi::Result<T>,
    ) -> StoreResult<T> {
        PLANS.with(|plans| {
            let cell = &plans[statement as usize];
            if cell.get().is_none() {
                // prepare_mut: every statement takes a fresh snapshot, so a re-read sees the latest row.
                let plan = self.client.prepare_mut(statement.text(), parameter_types(statement)).map_err(spi_error)?;
                let _ = cell.set(plan.keep());
            }
            let plan = cell.get().expect("prepared above");
            self.client.update(plan, None, args).and_then(read).map_err(spi_error)
        })
    }

    /// Runs a statement that changes rows; returns how many.
    fn changed(&mut self, statement: Statement, args: &[pgrx::datum::DatumWithOid]) -> StoreResult<i64> {
        self.run(statement, args, |t| Ok(t.len() as i64))
    }
}

impl StateStore for PgStore<'_, '_> {
    fn read_only(&mut self) -> StoreResult<bool> {
        // SAFETY: a backend-global flag, read on the backend's only thread.
        Ok(unsafe { pg_sys::XactReadOnly })
    }

    fn read_bucket(&mut self, key: &str, lock: bool) -> StoreResult<Option<BucketState>> {
        let statement = if lock { Statement::BucketLock } else { Statement::BucketRead };
        self.run(statement, &[key.into()], |table| {
            if table.is_empty() {
                return Ok(None);
            }
            let (level, refilled_at, full_at) = table.first().get_three::<f64, i64, i64>()?;
            Ok(Some(BucketState {
                level: level.unwrap_or(0.0),
                refilled_at: refilled_at.unwrap_or(0),
                full_at: full_at.unwrap_or(0),
            }))
        })
    }

    fn write_bucket(&mut self, key: &str, expected: Option<&BucketState>, new: &BucketState) -> StoreResult<bool> {
        let n = match expected {
            None => self.changed(
                Statement::BucketInsert,
                &[key.into(), new.level.into(), new.refilled_at.into(), new.full_at.into()],
            )?,
            Some(old) => self.changed(
                Statement::BucketUpdate,
                &[
                    new.level.into(),
                    new.refilled_at.into(),
                    new.full_at.into(),
                    key.into(),
                    old.level.into(),
                    old.refilled_at.into(),
                ],
            )?,
        };
        Ok(n == 1)
    }

    fn read_budget(&mut self, key: &str, period: Period, lock: bool) -> StoreResult<Option<BudgetState>> {
        let statement = if lock { Statement::BudgetLock } else { Statement::BudgetRead };
        self.run(statement, &[key.into(), period.as_str().into()], |table| {
            if table.is_empty() {
                return Ok(None);
            }
            let (used, resets_at) = table.first().get_two::<i64, i64>()?;
            Ok(Some(BudgetState { used: used.unwrap_or(0), resets_at: resets_at.unwrap_or(0) }))
        })
    }

    fn write_budget(
        &mut self,
        key: &str,
        period: Period,
        expected: Option<&BudgetState>,
        new: &BudgetState,
    ) -> StoreResult<bool> {
        let n = match expected {
            None => self.changed(
                Statement::BudgetInsert,
                &[key.into(), period.as_str().into(), new.used.into(), new.resets_at.into()],
            )?,
            Some(old) => self.changed(
                Statement::BudgetUpdate,
                &[
                    new.used.into(),
                    new.resets_at.into(),
                    key.into(),
                    period.as_str().into(),
                    old.used.into(),
                    old.resets_at.into(),
                ],
            )?,
        };
        Ok(n == 1)
    }

    fn change_bucket(&mut self, key: &str, change: &mut Change<'_, BucketState>) -> StoreResult<u64> {
        guard::with_change(&guard::BUCKET, change, || self.changed(Statement::BucketChange, &[key.into()]))
            .map(|n| n as u64)
    }

    fn change_budget(&mut self, key: &str, period: Period, change: &mut Change<'_, BudgetState>) -> StoreResult<u64> {
        guard::with_change(&guard::BUDGET, change, || {
            self.changed(Statement::BudgetChange, &[key.into(), period.as_str().into()])
        })
        .map(|n| n as u64)
    }

    fn sweep_buckets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        self.changed(Statement::SweepBuckets, &[cutoff_ms.into(), limit.into()])
    }

    fn sweep_budgets(&mut self, cutoff_ms: i64, limit: i64) -> StoreResult<i64> {
        self.changed(Statement::SweepBudgets, &[cutoff_ms.into(), limit.into()])
    }

    fn reset(&mut self, key: &str) -> StoreResult<i64> {
        Ok(self.changed(Statement::ResetBuckets, &[key.into()])?
            + self.changed(Statement::ResetBudgets, &[key.into()])?)
    }

    fn has_row_locks(&self) -> bool {
        true
    }

    /// A call already runs inside the caller's transaction, which makes it one unit.
    fn begin_atomic(&mut self) -> StoreResult<bool> {
        Ok(false)
    }

    fn end_atomic(&mut self, _owned: bool, _commit: bool) -> StoreResult<()> {
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
            serde_json::json!({"admitted": false, "used": 1, "limit": 1, "remaining": 0, "resets_at": 86400, "retry_after_seconds": 86400})
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

    /// Each bad input is an error with the core's message. Every case is a test of its own:
    /// an error inside a SECURITY DEFINER function must abort its transaction to restore the
    /// caller's settings. (The client suite checks SQLSTATE 22023 for each.)
    macro_rules! bad_input {
        ($($name:ident: $sql:literal => $message:literal;)*) => {$(
            #[pg_test(error = $message)]
            fn $name() {
                explicit_clock();
                Spi::run($sql).unwrap();
            }
        )*};
    }

    bad_input! {
        null_key: "SELECT rl_take(NULL, 3, 60)" => "rl_take: key must be text, got NULL";
        empty_key: "SELECT rl_take('', 3, 60)" => "rl_take: key must not be empty";
        long_key: "SELECT rl_take(repeat('x', 1025), 3, 60)" => "rl_take: key must be at most 1024 bytes, got 1025 bytes";
        zero_burst: "SELECT rl_take('k', 0, 60)" => "rl_take: burst must be a finite number greater than 0, got 0";
        nan_burst: "SELECT rl_take('k', 'NaN', 60)" => "rl_take: burst must be a finite number greater than 0, got NaN";
        infinite_rate: "SELECT rl_take('k', 3, 'Infinity')" => "rl_take: refill_per_minute must be a finite number greater than 0, got Infinity";
        negative_cost: "SELECT rl_take('k', 3, 60, -1)" => "rl_take: cost must be a finite number greater than 0, got -1";
        negative_now: "SELECT rl_take('k', 3, 60, 1, -1)" => "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got -1";
        unknown_period: "SELECT rl_spend('k', 'year', 3)" => "rl_spend: period must be 'day' or 'month', got 'year'";
        null_quota: "SELECT rl_spend('k', 'day', NULL)" => "rl_spend: quota must be a finite number greater than 0, got NULL";
        zero_budget_cost: "SELECT rl_budget('k', 'day', 3, 0)" => "rl_budget: cost must be a finite number greater than 0, got 0";
        fractional_sweep_clock: "SELECT rl_sweep(1.5)" => "rl_sweep: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 1.5";
        null_key_part: "SELECT rl_key('a', NULL)" => "rl_key: part 2 must not be NULL";
        zero_refund: "SELECT rl_refund('k', 3, 60, 0)" => "rl_refund: amount must be a finite number greater than 0, got 0";
        duplicate_items: "SELECT rl_take_all('[{\"key\": \"a\", \"period\": \"day\", \"quota\": 1}, {\"key\": \"a\", \"period\": \"day\", \"quota\": 2}]')"
            => "rl_take_all: items 1 and 2 are the same limit (one key may appear once per kind and period)";
        headers_of_nothing: "SELECT rl_headers('{}')"
            => "rl_headers: result must be a JSON object returned by rl_take, rl_peek, rl_refund, rl_spend, rl_budget or rl_take_all";
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
