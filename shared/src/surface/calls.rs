//! What each SQL function does, reached from its descriptor ([`crate::functions`]):
//! parse the arguments into typed values, run the protocol, render the answer.

use crate::args::{self, Arg, Clock};
use crate::bucket::BucketState;
use crate::budget::BudgetState;
use crate::call_args::{
    self, AcquireArgs, BlockArgs, BudgetsNearArgs, CallArgs, CheckArgs, LeaseArgs, PenalizeArgs, RefundBudgetArgs,
    SpendArgs, SweepArgs, TakeAllArgs, TakeArgs, WindowArgs,
};
use crate::decision_slot::{self, NotInStatement};
use crate::error::{Error, Result};
use crate::functions::{Entry, Function, InternalCall, ProcessCall, PureCall, StateCall};
use crate::json::Json;
use crate::render::ToJson;
use crate::store::Store;
use crate::{headers, key, protocol};

/// A function's result, typed as its descriptor's `returns`.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A JSON object (jsonb in PostgreSQL, text in SQLite).
    Json(Json),
    Text(String),
    Int(i64),
    Real(f64),
    Bool(bool),
}

/// Runs `f` with the engine's arguments. The one entry point of every engine.
pub fn call<S: Store>(f: &Function, store: &mut S, args: &[Arg], clock: &Clock) -> Result<Answer> {
    let answer = f.check_arity(args.len()).and_then(|()| match f.entry {
        Entry::State(which) => state(which, &CallArgs::new(f, args), store, clock),
        entry => without_store(entry, args),
    });
    answer.map_err(|e| e.in_function(f.name))
}

/// Runs a function that needs no store (pure or internal); a state function is an error.
pub fn call_without_store(f: &Function, args: &[Arg]) -> Result<Answer> {
    let answer = f.check_arity(args.len()).and_then(|()| without_store(f.entry, args));
    answer.map_err(|e| e.in_function(f.name))
}

fn without_store(entry: Entry, args: &[Arg]) -> Result<Answer> {
    match entry {
        Entry::Pure(PureCall::Key) => key::encode_key(args).map(Answer::Text),
        Entry::Pure(PureCall::Version) => Ok(Answer::Text(env!("CARGO_PKG_VERSION").to_owned())),
        Entry::Pure(PureCall::Headers) => rl_headers(args),
        Entry::Pure(PureCall::PolicyValidate) => match args::nth(args, 0) {
            Arg::Text(t) => crate::policy::Policy::parse(t).map(|p| Answer::Json(p.to_json())),
            other => Err(Error::invalid(format!("definition must be JSON, got {}", other.describe()))),
        },
        Entry::Process(ProcessCall::PolicyStats) => Ok(Answer::Json(crate::stats::to_json(crate::stats::sink()))),
        Entry::Process(ProcessCall::StatsReset) => Ok(Answer::Int(crate::stats::sink().reset() as i64)),
        Entry::Process(ProcessCall::TopRefused) => top_refused(args),
        Entry::Internal(InternalCall::BucketGuard) => bucket_guard(args),
        Entry::Internal(InternalCall::BudgetGuard) => budget_guard(args),
        Entry::Internal(InternalCall::BucketNewLevel) => decided_bucket().map(|r| Answer::Real(r.level)),
        Entry::Internal(InternalCall::BucketNewRefilledAt) => decided_bucket().map(|r| Answer::Int(r.refilled_at)),
        Entry::Internal(InternalCall::BucketNewFullAt) => decided_bucket().map(|r| Answer::Int(r.full_at)),
        Entry::Internal(InternalCall::BudgetNewUsed) => decided_budget().map(|r| Answer::Int(r.used)),
        Entry::Internal(InternalCall::BudgetNewResetsAt) => decided_budget().map(|r| Answer::Int(r.resets_at)),
        Entry::Internal(InternalCall::BudgetNewQuota) => decided_budget().map(|r| Answer::Int(r.quota)),
        Entry::State(_) => Err(Error::storage("needs the database it is called in")),
        Entry::Server(_) => Err(Error::storage("is answered by the PostgreSQL server")),
    }
}

/// rl_top_refused(policy [, n = 10]): n from 1 to the summary's size.
fn top_refused(args: &[Arg]) -> Result<Answer> {
    let policy = args::name("policy", &args::nth(args, 0))?;
    let n = match args.get(1) {
        None => 10,
        Some(a) => match args::as_integer(a) {
            Some(n) if (1..=crate::refused::ENTRIES as i64).contains(&n) => n as usize,
            _ => {
                let most = crate::refused::ENTRIES;
                return Err(Error::invalid(crate::messages::INTEGER_RANGE.render(&[&"n", &most, &a.describe()])));
            }
        },
    };
    let sink = crate::stats::sink();
    Ok(Answer::Json(crate::refused::to_json(policy, sink.scope(), &sink.top_refused(policy, n))))
}

fn state<S: Store>(which: StateCall, call: &CallArgs, store: &mut S, clock: &Clock) -> Result<Answer> {
    let json = |r: &dyn ToJson| Answer::Json(r.to_json());
    let compact = |r: &dyn ToJson| headers::compact(&r.to_json()).map(Answer::Text);
    Ok(match which {
        StateCall::Take => json(&protocol::take(store, &TakeArgs::parse(call, clock)?)?),
        StateCall::TakeCompact => compact(&protocol::take(store, &TakeArgs::parse(call, clock)?)?)?,
        StateCall::Peek => json(&protocol::peek(store, &TakeArgs::parse(call, clock)?)?),
        StateCall::Refund => json(&protocol::refund(store, &TakeArgs::parse(call, clock)?)?),
        StateCall::Spend => json(&protocol::spend(store, &SpendArgs::parse(call, clock)?)?),
        StateCall::Budget => json(&protocol::peek_budget(store, &SpendArgs::parse(call, clock)?)?),
        StateCall::RefundBudget => json(&protocol::refund_budget(store, &RefundBudgetArgs::parse(call, clock)?)?),
        StateCall::Sweep => Answer::Int(protocol::sweep(store, &SweepArgs::parse(call, clock)?)?),
        StateCall::Reset => Answer::Int(protocol::reset(store, args::key(&call.get("key").arg)?)?),
        StateCall::TakeAll => {
            let limits = call_args::limits_json(call)?;
            json(&protocol::take_all(store, &TakeAllArgs::parse(&limits, call, clock)?)?)
        }
        StateCall::TakeAllCompact => {
            let limits = call_args::limits_json(call)?;
            compact(&protocol::take_all(store, &TakeAllArgs::parse(&limits, call, clock)?)?)?
        }
        StateCall::RefundAll => {
            let limits = call_args::limits_json(call)?;
            json(&protocol::refund_all(store, &TakeAllArgs::parse(&limits, call, clock)?)?)
        }
        StateCall::ChargeAll => {
            let limits = call_args::limits_json(call)?;
            json(&protocol::charge_all(store, &TakeAllArgs::parse(&limits, call, clock)?)?)
        }
        StateCall::CheckLimits => {
            let (name, subject) = (call.name("name")?, call.name("subject")?);
            let limits = call_args::limits_json(call)?;
            json(&protocol::check_limits(store, name, subject, &TakeAllArgs::parse(&limits, call, clock)?)?)
        }
        StateCall::Window => json(&protocol::window(store, &WindowArgs::parse(call, clock)?)?),
        StateCall::WindowPeek => json(&protocol::window_peek(store, &WindowArgs::parse(call, clock)?)?),
        StateCall::FixedWindow => json(&protocol::window(store, &WindowArgs::parse(call, clock)?.fixed())?),
        StateCall::FixedWindowPeek => json(&protocol::window_peek(store, &WindowArgs::parse(call, clock)?.fixed())?),
        StateCall::Acquire => json(&protocol::acquire(store, &AcquireArgs::parse(call, clock)?)?),
        StateCall::Release => Answer::Bool(protocol::release(store, &LeaseArgs::parse(call, clock)?)?),
        StateCall::Renew => json(&protocol::renew(store, &LeaseArgs::parse(call, clock)?)?),
        StateCall::InFlight => {
            let (key, now_ms) = call_args::first_name_at(call, clock)?;
            Answer::Int(protocol::in_flight(store, key, now_ms)?)
        }
        StateCall::Charge => json(&protocol::charge(store, &TakeArgs::parse(call, clock)?)?),
        StateCall::ChargeBudget => json(&protocol::charge_budget(store, &RefundBudgetArgs::parse(call, clock)?)?),
        StateCall::PolicySet => {
            let policy = args::name("name", &call.get("name").arg)?;
            let definition = match call.get("definition").arg {
                Arg::Text(t) => t,
                other => return Err(Error::invalid(format!("definition must be JSON, got {}", other.describe()))),
            };
            Answer::Json(protocol::policy_set(store, policy, definition)?.to_json())
        }
        StateCall::PolicyDrop => {
            Answer::Bool(protocol::policy_drop(store, args::name("name", &call.get("name").arg)?)?)
        }
        StateCall::Check => json(&protocol::check(store, &CheckArgs::parse(call, clock)?)?),
        StateCall::CheckCompact => compact(&protocol::check(store, &CheckArgs::parse(call, clock)?)?)?,
        StateCall::RefundCheck => json(&protocol::refund_check(store, &CheckArgs::parse(call, clock)?)?),
        StateCall::ChargeCheck => json(&protocol::charge_check(store, &CheckArgs::parse(call, clock)?)?),
        StateCall::PeekCheck => json(&protocol::peek_check(store, &CheckArgs::parse(call, clock)?)?),
        StateCall::Penalize => json(&protocol::penalize(store, &PenalizeArgs::parse(call, clock)?)?),
        StateCall::Block => json(&protocol::block(store, &BlockArgs::parse(call, clock)?)?),
        StateCall::BudgetsNear => json(&protocol::budgets_near(store, &BudgetsNearArgs::parse(call, clock)?)?),
        StateCall::Usage => json(&protocol::usage(store, &crate::call_args::UsageArgs::parse(call)?)?),
        StateCall::UsageAll => json(&protocol::usage_page(store, &crate::call_args::UsageAllArgs::parse(call)?)?),
        StateCall::UsageRetention => {
            Answer::Int(protocol::usage_retention(store, crate::call_args::retention_days(call)?)?)
        }
        StateCall::Unblock => {
            let (subject, now_ms) = call_args::first_name_at(call, clock)?;
            Answer::Bool(protocol::unblock(store, subject, now_ms)?)
        }
    })
}

/// `rl_headers(result)`.
fn rl_headers(args: &[Arg]) -> Result<Answer> {
    match args::nth(args, 0) {
        Arg::Text(t) => headers::headers(t).map(Answer::Json),
        other => Err(Error::invalid(format!("result must be JSON text, got {}", other.describe()))),
    }
}

fn internal<T>(r: std::result::Result<T, NotInStatement>) -> Result<T> {
    r.map_err(|e| Error::not_in_statement(e.to_string()))
}

/// `rl_bucket_guard(level, refilled_at, full_at)`: the WHERE clause of sql/statements/bucket_change.sql.
fn bucket_guard(args: &[Arg]) -> Result<Answer> {
    let row = BucketState {
        level: args::stored_real(&args::nth(args, 0)),
        refilled_at: args::stored_integer(&args::nth(args, 1)),
        full_at: args::stored_integer(&args::nth(args, 2)),
    };
    internal(decision_slot::decide_row(&decision_slot::BUCKET, &row)).map(Answer::Bool)
}

/// `rl_budget_guard(used, resets_at, quota)`: the WHERE clause of sql/statements/budget_change.sql.
fn budget_guard(args: &[Arg]) -> Result<Answer> {
    let row = BudgetState {
        used: args::stored_integer(&args::nth(args, 0)),
        resets_at: args::stored_integer(&args::nth(args, 1)),
        quota: args::stored_integer(&args::nth(args, 2)),
    };
    internal(decision_slot::decide_row(&decision_slot::BUDGET, &row)).map(Answer::Bool)
}

/// The bucket row the guarded UPDATE in progress writes (its SET clause).
fn decided_bucket() -> Result<BucketState> {
    internal(decision_slot::decided_row(&decision_slot::BUCKET))
}

/// The budget row the guarded UPDATE in progress writes (its SET clause).
fn decided_budget() -> Result<BudgetState> {
    internal(decision_slot::decided_row(&decision_slot::BUDGET))
}
