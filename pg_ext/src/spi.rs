//! The core's statements run through SPI: plans prepared on first use and kept for the
//! backend's lifetime, one SPI connection per call, and the checks the store asks of the
//! engine (read-only transactions, the checks epoch, Citus's distribution).

use std::cell::{Cell, OnceCell};

use crate::invalidation;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use pgrx::PgOid;
use ratelimit_core::bucket::BucketState;
use ratelimit_core::decision_slot::Decide;
use ratelimit_core::functions::SqlType;
use ratelimit_core::sql::{self, Statement, Value};
use ratelimit_core::sql_store::{BucketWrite, SqlEngine, SqlStore};
use ratelimit_core::store::ChangeResult;
use ratelimit_core::{StoreError, StoreResult};

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
pub(crate) fn with_store<T>(
    call: impl FnOnce(&mut SqlStore<PgEngine>) -> ratelimit_core::Result<T>,
) -> ratelimit_core::Result<T> {
    Spi::connect_mut(|client| {
        check_objects_once(client);
        call(&mut SqlStore(PgEngine { client: Some(client) }))
    })
}

/// A result row read by the core's column types (SPI numbers columns from 1; the
/// statements' columns are NOT NULL).
struct Columns<'r>(&'r pgrx::spi::SpiHeapTupleData<'r>);

impl sql::RowColumns for Columns<'_> {
    type Error = pgrx::spi::SpiError;

    fn real(&self, i: usize) -> pgrx::spi::Result<f64> {
        self.0.get::<f64>(i + 1).map(|v| v.unwrap_or(0.0))
    }

    fn text(&self, i: usize) -> pgrx::spi::Result<String> {
        self.0.get::<String>(i + 1).map(Option::unwrap_or_default)
    }

    fn integer(&self, i: usize) -> pgrx::spi::Result<i64> {
        self.0.get::<i64>(i + 1).map(|v| v.unwrap_or(0))
    }
}

/// Runs statements through `client`, or, without one, each through an SPI connection of
/// its own.
pub(crate) struct PgEngine<'a, 'conn> {
    pub(crate) client: Option<&'a mut SpiClient<'conn>>,
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
        Ok(transaction_is_read_only())
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
        self.run(statement, params, |table| table.map(|row| sql::decode_row(statement, &Columns(&row))).collect())
    }

    const CHECKS_EPOCH_IN_MEMORY: bool = true;

    fn checks_epoch(&mut self) -> Option<u64> {
        invalidation::checks_epoch()
    }

    fn runs_guarded_updates(&mut self) -> StoreResult<bool> {
        let sharded = || {
            let query = "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid \
                         OPERATOR(pg_catalog.=) ANY (ARRAY['ratelimit.rl_bucket'::pg_catalog.regclass, \
                         'ratelimit.rl_budget'::pg_catalog.regclass]))";
            Spi::get_one::<bool>(query).map(|b| b.unwrap_or(false)).map_err(|e| e.to_string())
        };
        invalidation::state_is_distributed(sharded)
            .map(|distributed| !distributed)
            .map_err(|message| StoreError { message, engine_code: None })
    }

    fn bucket_write(&mut self) -> StoreResult<BucketWrite> {
        Ok(if !self.runs_guarded_updates()? {
            BucketWrite::LockAndCompare
        } else if crate::heap_change::applies() {
            BucketWrite::InPlace
        } else {
            BucketWrite::GuardedUpdate
        })
    }

    fn change_bucket_in_place(&mut self, key: &str, decide: &Decide<BucketState>) -> Option<ChangeResult<BucketState>> {
        crate::heap_change::change_bucket(key, decide)
    }

    fn checks_changed(&mut self) -> StoreResult<()> {
        invalidation::checks_changed();
        Ok(())
    }
}

/// Whether the current transaction refuses writes (a read-only transaction, a standby).
#[allow(unsafe_code)]
fn transaction_is_read_only() -> bool {
    // SAFETY: a backend-global flag, read on the backend's only thread.
    unsafe { pg_sys::XactReadOnly }
}
