//! One entry point per SQL function: parse the arguments, run the rule, render the result.
//! Engines call these with their arguments converted to [`Arg`] and a [`Clock`].

use crate::args::{self, Arg, Clock};
use crate::bucket::TakeArgs;
use crate::budget::SpendArgs;
use crate::error::Result;
use crate::headers;
use crate::multi::{self, TakeAllArgs};
use crate::store::{self, StateStore};

pub const RL_TAKE: &str = "rl_take";
pub const RL_SPEND: &str = "rl_spend";
pub const RL_BUDGET: &str = "rl_budget";
pub const RL_SWEEP: &str = "rl_sweep";
pub const RL_PEEK: &str = "rl_peek";
pub const RL_REFUND: &str = "rl_refund";
pub const RL_REFUND_BUDGET: &str = "rl_refund_budget";
pub const RL_RESET: &str = "rl_reset";
pub const RL_TAKE_ALL: &str = "rl_take_all";

pub fn rl_take<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
    let a = TakeArgs::parse(RL_TAKE, args, clock)?;
    Ok(store::take(store, RL_TAKE, &a)?.to_json())
}

pub fn rl_spend<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
    let a = SpendArgs::parse(RL_SPEND, args, clock)?;
    Ok(store::spend(store, RL_SPEND, &a)?.to_json())
}

pub fn rl_budget<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
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

/// `rl_peek(key, burst, refill_per_minute [, cost [, now_ms]])`: rl_take's answer, changing nothing.
pub fn rl_peek<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
    let a = TakeArgs::parse(RL_PEEK, args, clock)?;
    Ok(store::peek(store, RL_PEEK, &a)?.to_json())
}

/// `rl_refund(key, burst, refill_per_minute, amount [, now_ms])`.
pub fn rl_refund<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
    args::arity(RL_REFUND, args.len(), 4, 5)?;
    let a = TakeArgs::parse_with(RL_REFUND, "amount", args, clock)?;
    Ok(store::refund(store, RL_REFUND, &a)?.to_json())
}

/// `rl_refund_budget(key, period, amount [, now_ms])`.
pub fn rl_refund_budget<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
    args::arity(RL_REFUND_BUDGET, args.len(), 3, 4)?;
    let a = SpendArgs {
        key: args::key(RL_REFUND_BUDGET, &args[0])?,
        period: args::period(RL_REFUND_BUDGET, &args[1])?,
        quota: 0,
        cost: args::amount_micros(RL_REFUND_BUDGET, "amount", &args[2])?,
        now_ms: args::now_ms(RL_REFUND_BUDGET, args.get(3), clock)?,
    };
    Ok(store::refund_budget(store, RL_REFUND_BUDGET, &a)?.to_json())
}

/// `rl_reset(key)`: the number of rows removed.
pub fn rl_reset<S: StateStore>(store: &mut S, args: &[Arg]) -> Result<i64> {
    args::arity(RL_RESET, args.len(), 1, 1)?;
    let key = args::key(RL_RESET, &args[0])?;
    store::reset(store, RL_RESET, key)
}

/// `rl_take_all(limits [, now_ms])`.
pub fn rl_take_all<S: StateStore>(store: &mut S, args: &[Arg], clock: &Clock) -> Result<String> {
    args::arity(RL_TAKE_ALL, args.len(), 1, 2)?;
    let json = multi::parse_limits(RL_TAKE_ALL, &args[0])?;
    let a = TakeAllArgs::parse(RL_TAKE_ALL, &json, args.get(1), clock)?;
    Ok(store::take_all(store, RL_TAKE_ALL, &a)?.to_json())
}

/// `rl_headers(result)`: pure.
pub fn rl_headers(args: &[Arg]) -> Result<String> {
    args::arity(headers::FUNCTION, args.len(), 1, 1)?;
    match args[0] {
        Arg::Text(t) => headers::headers(t),
        ref other => Err(crate::error::Error::invalid(
            headers::FUNCTION,
            format!("result must be JSON text, got {}", other.describe()),
        )),
    }
}
