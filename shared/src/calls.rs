//! One entry point per SQL function: parse the arguments, run the rule, render the result.
//! Engines call these with their arguments converted to [`Arg`] and a [`Clock`].

use crate::args::{self, Arg, Clock};
use crate::bucket::TakeArgs;
use crate::budget::SpendArgs;
use crate::error::Result;
use crate::store::{self, StateStore};
use serde_json::Value;

pub const RL_TAKE: &str = "rl_take";
pub const RL_SPEND: &str = "rl_spend";
pub const RL_BUDGET: &str = "rl_budget";
pub const RL_SWEEP: &str = "rl_sweep";

pub fn rl_take<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<Value> {
    let a = TakeArgs::parse(RL_TAKE, args, clock)?;
    Ok(store::take(store, RL_TAKE, &a)?.to_json())
}

pub fn rl_spend<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<Value> {
    let a = SpendArgs::parse(RL_SPEND, args, clock)?;
    Ok(store::spend(store, RL_SPEND, &a)?.to_json())
}

pub fn rl_budget<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<Value> {
    let a = SpendArgs::parse(RL_BUDGET, args, clock)?;
    Ok(store::peek_budget(store, RL_BUDGET, &a)?.to_json())
}

/// `rl_sweep([now_ms [, max_rows]])`. The cutoff is never later than the real clock, so no
/// caller's clock can make a bucket that is still refilling, or a current budget, look
/// finished. That makes an explicit now_ms harmless here, so it needs no permission.
/// `max_rows` bounds one call's work (and, in one transaction, the locks it holds).
pub fn rl_sweep<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<i64> {
    args::arity(RL_SWEEP, args.len(), 0, 2)?;
    let requested = args::explicit_now_ms(RL_SWEEP, args.first())?.unwrap_or(clock.wall_ms);
    let max_rows = args::max_rows(RL_SWEEP, args.get(1))?;
    store::sweep(store, RL_SWEEP, requested.min(clock.wall_ms), max_rows)
}

pub fn rl_key(parts: &[Arg]) -> Result<String> {
    crate::key::encode_key(parts)
}
