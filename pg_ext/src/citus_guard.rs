//! A guard in front of two crashes in Citus's function call delegation (13.2.2 and 14.0.1;
//! `citus/function_call_delegation.patch` fixes them in Citus itself). After
//! `standard_planner` has run, Citus looks at the planned query's one target (or FROM
//! function) and, when it is a distributed function, finds the worker by hashing its
//! distribution argument:
//! - a NULL constant there (a literal NULL, a NULL bound parameter once the planner
//!   substituted it, an expression folded to NULL) is hashed as a pointer to text, and the
//!   backend dies (`FindShardInterval` -> `hashtext(NULL)`);
//! - a query whose arguments the planner pulled up out of a subquery or VALUES list in
//!   FROM is deparsed for the worker from the tree the planner rewrote in place, and the
//!   backend dies in `AcquireRewriteLocks`.
//!
//! Either restarts every session of the coordinator. This extension's planner step runs
//! inside `standard_planner` at the end of planning the top query level
//! (`create_upper_paths_hook`, final stage), sees the same tree Citus will, and raises a
//! clear error for a call of one of its own functions in either shape, before Citus sees
//! it. The first shape is the error the function itself raises for a NULL key. A
//! superuser may turn the guard off (`pg_ratelimit.citus_guard`) on a Citus with the fix.
//!
//! This module may use `unsafe` (the workspace denies it elsewhere): installing the hook
//! and reading the planner's tree. Invariants: the hook is installed once, in `_PG_init`,
//! chaining the one before it; the tree is only read, during planning, as PostgreSQL built it.
#![allow(unsafe_code)]

use std::ffi::CStr;

use pgrx::prelude::*;
use pgrx::{pg_sys, PgList};
use ratelimit_core::functions;

static mut PREVIOUS: pg_sys::create_upper_paths_hook_type = None;

/// Installs the guard (once, from `_PG_init`).
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any planning.
    unsafe {
        PREVIOUS = pg_sys::create_upper_paths_hook;
        pg_sys::create_upper_paths_hook = Some(at_final_stage);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn at_final_stage(
    root: *mut pg_sys::PlannerInfo,
    stage: pg_sys::UpperRelationKind::Type,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut std::ffi::c_void,
) {
    // SAFETY: the hook before this one, called as PostgreSQL would.
    if let Some(previous) = unsafe { PREVIOUS } {
        unsafe { previous(root, stage, input_rel, output_rel, extra) };
    }
    // SAFETY: the planner passes its own valid PlannerInfo.
    let top_level = unsafe { (*root).parent_root.is_null() };
    if stage == pg_sys::UpperRelationKind::UPPERREL_FINAL && top_level && crate::settings::CITUS_GUARD.get() {
        // only a call in a crashing shape pays for the catalog lookups
        if let Some(call) = unsafe { delegable_call((*root).parse) }.filter(|c| c.key_is_null_constant || c.pulled_up) {
            refuse_crashing_shapes(&call);
        }
    }
}

/// A call of a function in the shape Citus delegates.
struct Call {
    funcid: pg_sys::Oid,
    key_is_null_constant: bool,
    /// The range table holds more than the one FROM item: the planner pulled something up.
    pulled_up: bool,
}

/// The query's call, when the query is what Citus's delegation looks for: a SELECT of one
/// function call without WHERE, its FROM empty or that one function.
unsafe fn delegable_call(query: *mut pg_sys::Query) -> Option<Call> {
    // SAFETY (all below): nodes of the planner's tree, each read after its tag.
    unsafe {
        let query = query.as_ref()?;
        if query.commandType != pg_sys::CmdType::CMD_SELECT || query.jointree.is_null() {
            return None;
        }
        let jointree = &*query.jointree;
        let from = PgList::<pg_sys::Node>::from_pg(jointree.fromlist);
        if !jointree.quals.is_null() || from.len() != 1 {
            return None;
        }
        let item = from.get_ptr(0)?;
        if (*item).type_ != pg_sys::NodeTag::T_RangeTblRef {
            return None;
        }
        let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg(query.rtable);
        let entry = rtable.get_ptr(((*item.cast::<pg_sys::RangeTblRef>()).rtindex - 1) as usize)?;
        let targets = PgList::<pg_sys::TargetEntry>::from_pg(query.targetList);
        let expr = match (*entry).rtekind {
            pg_sys::RTEKind::RTE_RESULT if targets.len() == 1 => (*targets.get_ptr(0)?).expr.cast::<pg_sys::Node>(),
            pg_sys::RTEKind::RTE_FUNCTION => {
                let functions = PgList::<pg_sys::RangeTblFunction>::from_pg((*entry).functions);
                if functions.len() != 1 {
                    return None;
                }
                (*functions.get_ptr(0)?).funcexpr
            }
            _ => return None,
        };
        if expr.is_null() || (*expr).type_ != pg_sys::NodeTag::T_FuncExpr {
            return None;
        }
        let call = &*expr.cast::<pg_sys::FuncExpr>();
        let args = PgList::<pg_sys::Node>::from_pg(call.args);
        let first = args.get_ptr(0).map(|a| pg_sys::strip_implicit_coercions(a));
        let key_is_null_constant =
            first.is_some_and(|a| (*a).type_ == pg_sys::NodeTag::T_Const && (*a.cast::<pg_sys::Const>()).constisnull);
        Some(Call { funcid: call.funcid, key_is_null_constant, pulled_up: rtable.len() != 1 })
    }
}

/// The descriptor of `funcid` when it is a function of this extension.
fn own_function(funcid: pg_sys::Oid) -> Option<&'static functions::Function> {
    // SAFETY: a syscache lookup; NULL for a function that does not exist.
    let name = unsafe { pg_sys::get_func_name(funcid) };
    if name.is_null() {
        return None;
    }
    // SAFETY: a palloc'd NUL-terminated name.
    let function = functions::by_name(unsafe { CStr::from_ptr(name) }.to_str().ok()?)?;
    // SAFETY: catalog lookups by oid and by NUL-terminated name (InvalidOid when missing).
    let ours = unsafe {
        let extension = pg_sys::get_extension_oid(c"pg_ratelimit".as_ptr(), true);
        extension != pg_sys::InvalidOid
            && pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, funcid) == extension
    };
    ours.then_some(function)
}

/// Raises the error for `call` when it is one of this extension's keyed functions and
/// Citus delegates it.
fn refuse_crashing_shapes(call: &Call) {
    let Some(function) = own_function(call.funcid) else { return };
    let keyed = function.params.first().is_some_and(|p| p.name == "key");
    if !keyed || !citus_delegates(call.funcid) {
        return;
    }
    if call.key_is_null_constant {
        let null_key = ratelimit_core::args::key(&ratelimit_core::Arg::Null).map(|_| ());
        crate::dispatch::raise(null_key.expect_err("a NULL key is refused").in_function(function.name));
    }
    pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "{}: Citus cannot delegate a call whose arguments come from a subquery or VALUES list in FROM \
             (its function call delegation would crash the backend)",
            function.name
        ),
        function.name,
    )
    .set_hint(
        "Pass the arguments directly (SELECT rl_take($1, ...)) or from a table, or run a Citus with the fix in \
         citus/function_call_delegation.patch.",
    )
    .report(PgLogLevel::ERROR);
}

/// Whether Citus is installed here and delegates calls of `funcid` (a distributed function
/// with a distribution argument).
fn citus_delegates(funcid: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup by a NUL-terminated name; InvalidOid without Citus.
    let citus = unsafe {
        pg_sys::get_relname_relid(c"pg_dist_object".as_ptr(), pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE))
    };
    if citus == pg_sys::InvalidOid {
        return false;
    }
    let query = format!(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_object WHERE classid = 'pg_catalog.pg_proc'::pg_catalog.regclass \
         AND objid = {} AND distribution_argument_index IS NOT NULL)",
        funcid.to_u32()
    );
    Spi::get_one::<bool>(&query).ok().flatten().unwrap_or(false)
}
