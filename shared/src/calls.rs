//! What each SQL function does, reached from its descriptor ([`crate::functions`]):
//! parse the arguments into typed values, run the protocol, render the answer.

use crate::args::{
    self, AcquireArgs, Arg, BlockArgs, CheckArgs, Clock, LeaseArgs, PenalizeArgs, RefundBudgetArgs, SpendArgs,
    SweepArgs, TakeAllArgs, TakeArgs, WindowArgs,
};
use crate::bucket::BucketState;
use crate::budget::BudgetState;
use crate::decision_slot::{self, NotInStatement};
use crate::error::{Error, Result};
use crate::functions::{Entry, Function};
use crate::render::{Json, ToJson};
use crate::store::LockingStore;
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

/// The functions that read or write state, each run over a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateCall {
    Take,
    Spend,
    Budget,
    Sweep,
    Peek,
    Refund,
    RefundBudget,
    Reset,
    TakeAll,
    Window,
    WindowPeek,
    Acquire,
    Release,
    Renew,
    InFlight,
    Charge,
    ChargeBudget,
    PolicySet,
    PolicyDrop,
    Check,
    RefundCheck,
    Penalize,
    Block,
    Unblock,
}

impl StateCall {
    /// Whether the call reads or writes buckets (and so needs the memory store when
    /// buckets live there).
    pub fn touches_buckets(self) -> bool {
        matches!(
            self,
            StateCall::Take
                | StateCall::Peek
                | StateCall::Refund
                | StateCall::Charge
                | StateCall::Sweep
                | StateCall::Reset
                | StateCall::TakeAll
                | StateCall::Check
                | StateCall::RefundCheck
        )
    }
}

/// Runs `f` with the engine's arguments. The one entry point of every engine.
pub fn call<S: LockingStore>(f: &Function, store: &mut S, args: &[Arg], clock: &Clock) -> Result<Answer> {
    f.check_arity(args.len())?;
    match f.entry {
        Entry::State(which) => state(which, f.name, store, args, clock),
        Entry::Pure(run) | Entry::Internal(run) | Entry::Process(run) => run(f, args),
        Entry::Server => Err(Error::storage(f.name, "is answered by the PostgreSQL server")),
    }
}

/// Runs a function that needs no store (pure or internal); a state function is an error.
pub fn call_without_store(f: &Function, args: &[Arg]) -> Result<Answer> {
    f.check_arity(args.len())?;
    match f.entry {
        Entry::Pure(run) | Entry::Internal(run) | Entry::Process(run) => run(f, args),
        Entry::State(_) => Err(Error::storage(f.name, "needs the database it is called in")),
        Entry::Server => Err(Error::storage(f.name, "is answered by the PostgreSQL server")),
    }
}

fn state<S: LockingStore>(
    which: StateCall,
    name: &'static str,
    store: &mut S,
    args: &[Arg],
    clock: &Clock,
) -> Result<Answer> {
    let json = |r: &dyn ToJson| Answer::Json(r.to_json());
    Ok(match which {
        StateCall::Take => json(&protocol::take(store, name, &TakeArgs::parse(name, "cost", args, clock)?)?),
        StateCall::Peek => json(&protocol::peek(store, name, &TakeArgs::parse_peek(name, args, clock)?)?),
        StateCall::Refund => json(&protocol::refund(store, name, &TakeArgs::parse(name, "amount", args, clock)?)?),
        StateCall::Spend => json(&protocol::spend(store, name, &SpendArgs::parse(name, args, false, clock)?)?),
        StateCall::Budget => json(&protocol::peek_budget(store, name, &SpendArgs::parse(name, args, true, clock)?)?),
        StateCall::RefundBudget => {
            json(&protocol::refund_budget(store, name, &RefundBudgetArgs::parse(name, args, clock)?)?)
        }
        StateCall::Sweep => Answer::Int(protocol::sweep(store, name, &SweepArgs::parse(name, args, clock)?)?),
        StateCall::Reset => Answer::Int(protocol::reset(store, name, args::key(name, &args::nth(args, 0))?)?),
        StateCall::TakeAll => {
            let limits = args::limits_json(name, &args::nth(args, 0))?;
            let parsed = TakeAllArgs::parse(name, &limits, &args::nth(args, 1), clock)?;
            json(&protocol::take_all(store, name, &parsed)?)
        }
        StateCall::Window => json(&protocol::window(store, name, &WindowArgs::parse(name, args, false, clock)?)?),
        StateCall::WindowPeek => {
            json(&protocol::window_peek(store, name, &WindowArgs::parse(name, args, true, clock)?)?)
        }
        StateCall::Acquire => json(&protocol::acquire(store, name, &AcquireArgs::parse(name, args, clock)?)?),
        StateCall::Release => {
            Answer::Bool(protocol::release(store, name, &LeaseArgs::parse(name, args, false, clock)?)?)
        }
        StateCall::Renew => json(&protocol::renew(store, name, &LeaseArgs::parse(name, args, true, clock)?)?),
        StateCall::InFlight => {
            let (key, now_ms) = args::key_at(name, args, clock)?;
            Answer::Int(protocol::in_flight(store, name, key, now_ms)?)
        }
        StateCall::Charge => json(&protocol::charge(store, name, &TakeArgs::parse(name, "amount", args, clock)?)?),
        StateCall::ChargeBudget => {
            json(&protocol::charge_budget(store, name, &RefundBudgetArgs::parse(name, args, clock)?)?)
        }
        StateCall::PolicySet => {
            let policy = args::name(name, "name", &args::nth(args, 0))?;
            let definition = match args::nth(args, 1) {
                Arg::Text(t) => t,
                other => {
                    return Err(Error::invalid(name, format!("definition must be JSON, got {}", other.describe())))
                }
            };
            Answer::Json(protocol::policy_set(store, name, policy, definition)?.to_json())
        }
        StateCall::PolicyDrop => {
            Answer::Bool(protocol::policy_drop(store, name, args::name(name, "name", &args::nth(args, 0))?)?)
        }
        StateCall::Check => Answer::Json(protocol::check(store, name, &CheckArgs::parse(name, args, clock)?)?),
        StateCall::RefundCheck => {
            Answer::Json(protocol::refund_check(store, name, &CheckArgs::parse(name, args, clock)?)?)
        }
        StateCall::Penalize => json(&protocol::penalize(store, name, &PenalizeArgs::parse(name, args, clock)?)?),
        StateCall::Block => json(&protocol::block(store, name, &BlockArgs::parse(name, args, clock)?)?),
        StateCall::Unblock => {
            let (subject, now_ms) =
                (args::name(name, "subject", &args::nth(args, 0))?, args::now_ms(name, &args::nth(args, 1), clock)?);
            Answer::Bool(protocol::unblock(store, name, subject, now_ms)?)
        }
    })
}

/// `rl_key(part, ...)`.
pub fn rl_key(f: &Function, parts: &[Arg]) -> Result<Answer> {
    key::encode_key(f.name, parts).map(Answer::Text)
}

/// `rl_policy_stats()`.
pub fn rl_policy_stats(_f: &Function, _args: &[Arg]) -> Result<Answer> {
    Ok(Answer::Json(crate::stats::to_json(crate::stats::sink())))
}

/// `rl_stats_reset()`.
pub fn rl_stats_reset(_f: &Function, _args: &[Arg]) -> Result<Answer> {
    Ok(Answer::Int(crate::stats::sink().reset() as i64))
}

/// `rl_version()`.
pub fn rl_version(_f: &Function, _args: &[Arg]) -> Result<Answer> {
    Ok(Answer::Text(env!("CARGO_PKG_VERSION").to_owned()))
}

/// `rl_headers(result)`.
pub fn rl_headers(f: &Function, args: &[Arg]) -> Result<Answer> {
    match args::nth(args, 0) {
        Arg::Text(t) => headers::headers(f.name, t).map(|h| Answer::Json(Json::Text(h))),
        other => Err(Error::invalid(f.name, format!("result must be JSON text, got {}", other.describe()))),
    }
}

fn internal<T>(f: &Function, r: std::result::Result<T, NotInStatement>) -> Result<T> {
    r.map_err(|e| Error::not_in_statement(f.name, e.to_string()))
}

/// `rl_bucket_guard(level, refilled_at, full_at)`: the WHERE clause of sql/bucket_change.sql.
pub fn bucket_guard(f: &Function, args: &[Arg]) -> Result<Answer> {
    let row = BucketState {
        level: args::stored_real(&args::nth(args, 0)),
        refilled_at: args::stored_integer(&args::nth(args, 1)),
        full_at: args::stored_integer(&args::nth(args, 2)),
    };
    internal(f, decision_slot::decide_row(&decision_slot::BUCKET, &row)).map(Answer::Bool)
}

/// `rl_budget_guard(used, resets_at)`: the WHERE clause of sql/budget_change.sql.
pub fn budget_guard(f: &Function, args: &[Arg]) -> Result<Answer> {
    let row = BudgetState {
        used: args::stored_integer(&args::nth(args, 0)),
        resets_at: args::stored_integer(&args::nth(args, 1)),
    };
    internal(f, decision_slot::decide_row(&decision_slot::BUDGET, &row)).map(Answer::Bool)
}

/// The bucket row the guarded UPDATE in progress writes (its SET clause).
pub fn decided_bucket(f: &Function) -> Result<BucketState> {
    internal(f, decision_slot::decided_row(&decision_slot::BUCKET))
}

/// The budget row the guarded UPDATE in progress writes (its SET clause).
pub fn decided_budget(f: &Function) -> Result<BudgetState> {
    internal(f, decision_slot::decided_row(&decision_slot::BUDGET))
}
