//! Each state function's arguments as typed values, read through its descriptor
//! ([`crate::functions`]): by parameter name, which gives the position and the name its
//! errors use, and with the descriptor's facts (whether a cost may be 0, whether a lease
//! call renews) instead of flags passed by the caller. The rules themselves are
//! [`crate::args`]'.

use serde_json::Value;

use crate::args::{
    amount_micros, as_integer, cost_micros, cost_number, duration_ms, explicit_now_ms, json_arg, json_value, key,
    max_rows, name, now_ms, period, token_number, whole_number, Arg, Clock,
};
use crate::bucket::BucketLimits;
use crate::error::{Error, Result};
use crate::functions::{Function, Param, SqlType};
use crate::kind::{Cost, LimitKind};
use crate::lease::MAX_IN_FLIGHT;
use crate::limit_json::{self, LimitShape};
use crate::messages as msg;
use crate::penalty::Escalation;
use crate::take_all::{Item, Limit, MAX_ITEMS};
use crate::units::{Period, MICROS_PER_UNIT};
use crate::window::WindowLimits;

/// One argument with the parameter it is passed for.
#[derive(Debug, Clone, Copy)]
pub struct Given<'a> {
    pub param: &'static Param,
    pub arg: Arg<'a>,
    /// False when the caller left it out (its default applies).
    pub passed: bool,
}

impl<'a> Given<'a> {
    /// The argument when the caller passed it.
    fn passed(&self) -> Option<Arg<'a>> {
        self.passed.then_some(self.arg)
    }
}

/// What a descriptor without the parameter asked for reads: NULL, under a name that says so.
static NO_SUCH_PARAMETER: Param = Param {
    name: "?",
    sql_type: SqlType::Text,
    default: None,
    variadic: false,
    zero_allowed: false,
    rule: crate::functions::Rule::Unchecked,
};

/// A call's arguments beside its descriptor's parameters (the count was checked before).
#[derive(Debug, Clone, Copy)]
pub struct CallArgs<'c, 'a> {
    params: &'static [Param],
    args: &'c [Arg<'a>],
}

impl<'c, 'a> CallArgs<'c, 'a> {
    pub fn new(function: &Function, args: &'c [Arg<'a>]) -> Self {
        CallArgs { params: function.params, args }
    }

    /// The argument of parameter `i`.
    pub fn at(&self, i: usize) -> Given<'a> {
        let param = self.params.get(i).unwrap_or(&NO_SUCH_PARAMETER);
        Given { param, arg: self.args.get(i).copied().unwrap_or(Arg::Null), passed: i < self.args.len() }
    }

    /// The argument of the parameter named `name`.
    pub fn get(&self, name: &str) -> Given<'a> {
        let i = self.params.iter().position(|p| p.name == name);
        debug_assert!(i.is_some(), "no parameter {name} in {:?}", self.params);
        self.at(i.unwrap_or(usize::MAX))
    }

    pub fn has(&self, name: &str) -> bool {
        self.params.iter().any(|p| p.name == name)
    }

    fn key(&self) -> Result<&'a str> {
        key(&self.get("key").arg)
    }

    fn now_ms(&self, clock: &Clock) -> Result<i64> {
        now_ms(&self.get("now_ms").arg, clock)
    }

    /// A budget's or a window's cost in millionths: 1 when left out, 0 too where the
    /// parameter allows it (the peeks).
    fn cost_micros(&self) -> Result<i64> {
        let cost = self.get("cost");
        match cost.passed() {
            None => Ok(MICROS_PER_UNIT),
            Some(a) => cost_micros(cost.param.name, &a, cost.param.zero_allowed),
        }
    }

    /// A name-like argument (a policy, a subject, a tier) under its parameter's name.
    pub(crate) fn name(&self, param: &str) -> Result<&'a str> {
        name(param, &self.get(param).arg)
    }
}

/// `(key, burst, refill_per_minute [, cost = 1 [, now_ms]])` of rl_take and rl_peek, and
/// `(key, burst, refill_per_minute, amount [, now_ms])` of rl_refund and rl_charge.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeArgs<'a> {
    pub key: &'a str,
    pub limits: BucketLimits,
    /// The tokens to take (rl_take, rl_peek, rl_charge) or give back (rl_refund).
    pub cost: f64,
    pub now_ms: i64,
}

impl<'a> TakeArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        // the fourth parameter: cost (0 allowed by rl_peek's), or amount
        let tokens = call.at(3);
        Ok(TakeArgs {
            key: call.key()?,
            limits: BucketLimits {
                burst: token_number("burst", &call.get("burst").arg)?,
                refill_per_minute: token_number("refill_per_minute", &call.get("refill_per_minute").arg)?,
            },
            cost: match tokens.passed() {
                None => 1.0,
                Some(a) => cost_number(tokens.param.name, &a, tokens.param.zero_allowed)?,
            },
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(key, period, quota [, cost = 1 [, now_ms]])` of rl_spend and rl_budget.
#[derive(Debug, Clone, PartialEq)]
pub struct SpendArgs<'a> {
    pub key: &'a str,
    pub period: Period,
    /// Millionths.
    pub quota: i64,
    /// Millionths.
    pub cost: i64,
    pub now_ms: i64,
}

impl<'a> SpendArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        Ok(SpendArgs {
            key: call.key()?,
            period: period(&call.get("period").arg)?,
            quota: amount_micros("quota", &call.get("quota").arg)?,
            cost: call.cost_micros()?,
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(key, period, amount [, now_ms])` of rl_refund_budget and rl_charge_budget.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundBudgetArgs<'a> {
    pub key: &'a str,
    pub period: Period,
    /// Millionths.
    pub amount: i64,
    pub now_ms: i64,
}

impl<'a> RefundBudgetArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        Ok(RefundBudgetArgs {
            key: call.key()?,
            period: period(&call.get("period").arg)?,
            amount: amount_micros("amount", &call.get("amount").arg)?,
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(key, limit, window_seconds [, cost = 1 [, now_ms]])` of rl_window and rl_window_peek
/// (rl_fixed_window and rl_fixed_window_peek: the same, [`WindowArgs::fixed`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowArgs<'a> {
    pub key: &'a str,
    pub limits: WindowLimits,
    /// Millionths.
    pub cost: i64,
    pub now_ms: i64,
}

impl<'a> WindowArgs<'a> {
    /// The same limits as a fixed window.
    pub fn fixed(self) -> Self {
        WindowArgs { limits: WindowLimits { fixed: true, ..self.limits }, ..self }
    }

    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        Ok(WindowArgs {
            key: call.key()?,
            limits: WindowLimits {
                limit: amount_micros("limit", &call.get("limit").arg)?,
                window_ms: duration_ms("window_seconds", &call.get("window_seconds").arg)?,
                fixed: false,
            },
            cost: call.cost_micros()?,
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(key, max_in_flight, lease_seconds [, now_ms])` of rl_acquire.
#[derive(Debug, Clone, PartialEq)]
pub struct AcquireArgs<'a> {
    pub key: &'a str,
    pub max_in_flight: i64,
    pub lease_ms: i64,
    pub now_ms: i64,
}

impl<'a> AcquireArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        Ok(AcquireArgs {
            key: call.key()?,
            max_in_flight: whole_number("max_in_flight", &call.get("max_in_flight").arg, MAX_IN_FLIGHT)?,
            lease_ms: duration_ms("lease_seconds", &call.get("lease_seconds").arg)?,
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(key, lease [, now_ms])` of rl_release, and `(key, lease, lease_seconds [, now_ms])`
/// of rl_renew (lease_ms None for rl_release, whose descriptor has no lease_seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseArgs<'a> {
    pub key: &'a str,
    pub lease: &'a str,
    pub lease_ms: Option<i64>,
    pub now_ms: i64,
}

impl<'a> LeaseArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        let key = call.key()?;
        let lease = match call.get("lease").arg {
            Arg::Text(t) => t,
            other => return Err(Error::invalid(msg::NOT_TEXT.render(&[&"lease", &other.describe()]))),
        };
        let lease_ms = match call.has("lease_seconds") {
            true => Some(duration_ms("lease_seconds", &call.get("lease_seconds").arg)?),
            false => None,
        };
        Ok(LeaseArgs { key, lease, lease_ms, now_ms: call.now_ms(clock)? })
    }
}

/// `(policy, subject [, cost = 1 [, tier [, now_ms]]])` of rl_check, rl_refund_check and
/// rl_peek_check, and `(policy, subject, amount [, tier [, now_ms]])` of rl_charge_check.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckArgs<'a> {
    pub policy: &'a str,
    pub subject: &'a str,
    /// For buckets; the same in millionths for budgets and windows.
    pub cost: f64,
    pub tier: Option<&'a str>,
    pub now_ms: i64,
}

impl<'a> CheckArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        let policy = call.name("policy")?;
        let subject = call.name("subject")?;
        // the third parameter: cost (0 allowed by rl_peek_check's), or rl_charge_check's amount
        let cost = call.at(2);
        Ok(CheckArgs {
            policy,
            subject,
            cost: match cost.passed() {
                None => 1.0,
                // the budget rules: exact millionths, 0.000001 (or 0 for a peek) to 1,000,000,000
                Some(a) if cost.param.zero_allowed => {
                    cost_micros(cost.param.name, &a, true)? as f64 / MICROS_PER_UNIT as f64
                }
                Some(a) => amount_micros(cost.param.name, &a)? as f64 / MICROS_PER_UNIT as f64,
            },
            tier: match call.get("tier").arg {
                Arg::Null => None,
                _ => Some(call.name("tier")?),
            },
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(subject [, free_strikes = 3 [, base_seconds = 60 [, max_seconds = 3600 [,
/// window_seconds = 3600 [, now_ms]]]]])` of rl_penalize.
#[derive(Debug, Clone, PartialEq)]
pub struct PenalizeArgs<'a> {
    pub subject: &'a str,
    pub escalation: Escalation,
    pub now_ms: i64,
}

impl<'a> PenalizeArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        let seconds_or = |param: &str, default_ms: i64| match call.get(param).passed() {
            None => Ok(default_ms),
            Some(a) => duration_ms(param, &a),
        };
        Ok(PenalizeArgs {
            subject: call.name("subject")?,
            escalation: Escalation {
                free_strikes: match call.get("free_strikes").passed() {
                    None => 3,
                    Some(a) => match as_integer(&a) {
                        Some(n) if (0..=crate::penalty::MAX_FREE_STRIKES).contains(&n) => n,
                        _ => return Err(Error::invalid(msg::FREE_STRIKES.render(&[&a.describe()]))),
                    },
                },
                base_ms: seconds_or("base_seconds", 60_000)?,
                max_ms: seconds_or("max_seconds", 3_600_000)?,
                window_ms: seconds_or("window_seconds", 3_600_000)?,
            },
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(subject, seconds [, now_ms])` of rl_block: NULL seconds blocks until rl_unblock.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockArgs<'a> {
    pub subject: &'a str,
    pub length_ms: Option<i64>,
    pub now_ms: i64,
}

impl<'a> BlockArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<Self> {
        Ok(BlockArgs {
            subject: call.name("subject")?,
            length_ms: match call.get("seconds").arg {
                Arg::Null => None,
                a => Some(duration_ms("seconds", &a)?),
            },
            now_ms: call.now_ms(clock)?,
        })
    }
}

/// `(key [, now_ms])` of rl_in_flight, `(subject [, now_ms])` of rl_unblock: the name of
/// the first parameter and the clock.
pub fn first_name_at<'a>(call: &CallArgs<'_, 'a>, clock: &Clock) -> Result<(&'a str, i64)> {
    let first = call.at(0);
    let value = if first.param.name == "key" { key(&first.arg)? } else { name(first.param.name, &first.arg)? };
    Ok((value, call.now_ms(clock)?))
}

/// `([now_ms [, max_rows]])` of rl_sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepArgs {
    /// Rows finished by this time go. Never later than the real clock, so no caller's clock
    /// can make a bucket that is still refilling, or a current budget, look finished. That
    /// makes an explicit now_ms harmless here, so it needs no permission.
    pub cutoff_ms: i64,
    /// Bounds one call's work (and, in one transaction, the locks it holds).
    pub max_rows: i64,
}

impl SweepArgs {
    pub fn parse(call: &CallArgs, clock: &Clock) -> Result<Self> {
        let requested = explicit_now_ms(&call.get("now_ms").arg)?.unwrap_or(clock.wall_ms);
        Ok(SweepArgs { cutoff_ms: requested.min(clock.wall_ms), max_rows: max_rows(&call.get("max_rows").arg)? })
    }
}

/// `(fraction [, n = 100 [, now_ms]])` of rl_budgets_near.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetsNearArgs {
    /// The share of the quota a budget has used at least, from 0 (every budget with a quota)
    /// to [`crate::budget::MAX_NEAR_FRACTION`].
    pub fraction: f64,
    /// The most budgets listed, 1 to [`crate::budget::MAX_NEAR`].
    pub n: i64,
    pub now_ms: i64,
}

impl BudgetsNearArgs {
    pub fn parse(call: &CallArgs, clock: &Clock) -> Result<Self> {
        let fraction = call.get("fraction").arg;
        let most = crate::budget::MAX_NEAR_FRACTION;
        let fraction = match crate::args::as_number(&fraction) {
            Some(f) if (0.0..=most).contains(&f) => f,
            _ => return Err(Error::invalid(msg::FRACTION_RANGE.render(&[&(most as i64), &fraction.describe()]))),
        };
        let most = crate::budget::MAX_NEAR;
        let n = call.get("n");
        let n = match n.passed() {
            None => 100,
            Some(a) => match as_integer(&a) {
                Some(n) if (1..=most).contains(&n) => n,
                _ => return Err(Error::invalid(msg::INTEGER_RANGE.render(&[&"n", &most, &a.describe()]))),
            },
        };
        Ok(BudgetsNearArgs { fraction, n, now_ms: call.now_ms(clock)? })
    }
}

/// `(key, from_ms, to_ms)` of rl_usage: the ended periods of `key` whose end is in
/// `(from_ms, to_ms]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageArgs<'a> {
    pub key: &'a str,
    pub from_ms: i64,
    pub to_ms: i64,
}

impl<'a> UsageArgs<'a> {
    pub fn parse(call: &CallArgs<'_, 'a>) -> Result<Self> {
        let key = call.key()?;
        let (from_ms, to_ms) = usage_range(call)?;
        Ok(UsageArgs { key, from_ms, to_ms })
    }
}

/// `(from_ms, to_ms)` of rl_usage and rl_usage_all: epoch ms, to_ms not before from_ms.
fn usage_range(call: &CallArgs) -> Result<(i64, i64)> {
    let epoch_ms = |name: &str| {
        let arg = call.get(name).arg;
        match as_integer(&arg) {
            Some(ms) if (0..=crate::units::MAX_NOW_MS).contains(&ms) => Ok(ms),
            _ => Err(Error::invalid(msg::EPOCH_MS_RANGE.render(&[&name, &crate::units::MAX_NOW_MS, &arg.describe()]))),
        }
    };
    let (from_ms, to_ms) = (epoch_ms("from_ms")?, epoch_ms("to_ms")?);
    if to_ms < from_ms {
        return Err(Error::invalid(msg::USAGE_RANGE.render(&[&from_ms, &to_ms])));
    }
    Ok((from_ms, to_ms))
}

/// `(from_ms, to_ms [, after [, n]])` of rl_usage_all: a page of every key's ended periods
/// whose end is in `(from_ms, to_ms]`, after the cursor an earlier page answered as `next`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageAllArgs {
    pub from_ms: i64,
    pub to_ms: i64,
    pub after: Option<crate::budget::UsageCursor>,
    /// The most periods listed, 1 to [`crate::budget::MAX_USAGE_PERIODS`].
    pub n: i64,
}

impl UsageAllArgs {
    pub fn parse(call: &CallArgs) -> Result<Self> {
        let (from_ms, to_ms) = usage_range(call)?;
        let after = match call.get("after").arg {
            Arg::Null => None,
            arg => Some(usage_cursor(&arg)?),
        };
        let most = crate::budget::MAX_USAGE_PERIODS;
        let n = match call.get("n").passed() {
            None => crate::budget::USAGE_PAGE,
            Some(a) => match as_integer(&a) {
                Some(n) if (1..=most).contains(&n) => n,
                _ => return Err(Error::invalid(msg::INTEGER_RANGE.render(&[&"n", &most, &a.describe()]))),
            },
        };
        Ok(UsageAllArgs { from_ms, to_ms, after, n })
    }
}

/// A cursor as rl_usage_all answers it in `next`: `[ends_at_ms, key, period]`. What is
/// none is named by its JSON type (the engines write a JSON value's text differently).
fn usage_cursor(arg: &Arg) -> Result<crate::budget::UsageCursor> {
    let wrong = |what: String| Error::invalid(msg::USAGE_CURSOR.render(&[&what]));
    let Arg::Text(text) = arg else { return Err(wrong("text that is not JSON".into())) };
    let value: Value = serde_json::from_str(text).map_err(|_| wrong("text that is not JSON".into()))?;
    let parts = match &value {
        Value::Array(parts) if parts.len() == 3 => parts,
        Value::Array(parts) => return Err(wrong(format!("an array of {} values", parts.len()))),
        Value::Null => return Err(wrong("null".into())),
        Value::Bool(_) => return Err(wrong("a boolean".into())),
        Value::Number(_) => return Err(wrong("a number".into())),
        Value::String(_) => return Err(wrong("a string".into())),
        Value::Object(_) => return Err(wrong("an object".into())),
    };
    let most = crate::units::MAX_NOW_MS;
    match parts.as_slice() {
        [Value::Number(ends_at), Value::String(key), Value::String(period)] => {
            match ends_at.as_i64().filter(|ms| (0..=most).contains(ms)) {
                Some(ends_at) => Ok(crate::budget::UsageCursor { ends_at, key: key.clone(), period: period.clone() }),
                None => Err(Error::invalid(msg::USAGE_CURSOR_PARTS.render(&[&most]))),
            }
        }
        _ => Err(Error::invalid(msg::USAGE_CURSOR_PARTS.render(&[&most]))),
    }
}

/// `days` of rl_usage_retention: NULL reads, else 1 to [`crate::budget::MAX_RETENTION_DAYS`].
pub fn retention_days(call: &CallArgs<'_, '_>) -> Result<Option<i64>> {
    let most = crate::budget::MAX_RETENTION_DAYS;
    match call.get("days").arg {
        Arg::Null => Ok(None),
        a => match as_integer(&a) {
            Some(d) if (1..=most).contains(&d) => Ok(Some(d)),
            _ => Err(Error::invalid(msg::INTEGER_RANGE.render(&[&"days", &most, &a.describe()]))),
        },
    }
}

/// `(limits [, now_ms])` of rl_take_all: the limits in the order their rows are read.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeAllArgs<'a> {
    pub limits: Vec<Limit<'a>>,
    pub now_ms: i64,
}

/// The JSON argument of rl_take_all as a value, which [`TakeAllArgs`] borrows its keys from.
pub fn limits_json(call: &CallArgs) -> Result<Value> {
    match call.get("limits").arg {
        Arg::Text(t) => json_value("limits", t),
        other => Err(Error::invalid(format!("limits must be a JSON array, got {}", other.describe()))),
    }
}

impl<'a> TakeAllArgs<'a> {
    pub fn parse(json: &'a Value, call: &CallArgs, clock: &Clock) -> Result<Self> {
        let now_ms = call.now_ms(clock)?;
        let list = json.as_array().ok_or_else(|| Error::invalid(msg::LIMITS_NOT_AN_ARRAY.template))?;
        if list.is_empty() || list.len() > MAX_ITEMS {
            return Err(Error::invalid(msg::ITEM_COUNT.render(&[&"limits", &MAX_ITEMS, &list.len()])));
        }
        let mut limits = list
            .iter()
            .enumerate()
            .map(|(i, v)| item(i, v).map_err(|e| Error::invalid(format!("item {}: {}", i + 1, e.message))))
            .collect::<Result<Vec<_>>>()?;
        limits.sort_by(|x, y| x.row().cmp(&y.row()));
        if let Some(w) = limits.windows(2).find(|w| w[0].row() == w[1].row()) {
            let (a, b) = (w[0].position(), w[1].position());
            let (first, second) = (a.min(b) + 1, a.max(b) + 1);
            return Err(Error::invalid(format!(
                "items {first} and {second} are the same limit (one key may appear once per kind and period)"
            )));
        }
        Ok(TakeAllArgs { limits, now_ms })
    }
}

/// One item of rl_take_all: a key, a limit (by the parser policies share), a cost, and a
/// multiplier that scales the limit as a policy's tier does.
fn item<'a>(position: usize, v: &'a Value) -> Result<Limit<'a>> {
    let o = limit_json::object(v, &limit_json::ITEM)?;
    let key = key(&o.get("key").map_or(Arg::Null, json_arg))?;
    let cost = o.get("cost").map(json_arg);
    let item = crate::each_kind!(LimitShape => Limit, limit_json::shape(o)?, limits => {
        Item { position, key, cost: Cost::read(cost.as_ref())?, limits }
    });
    let Some(m) = o.get("multiplier") else { return Ok(item) };
    let m = crate::args::positive_number("multiplier", &json_arg(m))?;
    if !crate::each_kind!(Limit, &item, i => i.limits.scales_by(m)) {
        return Err(Error::invalid(
            msg::ITEM_MULTIPLIER_OUT_OF_RANGE
                .render(&[&(crate::units::MAX_TOKENS as i64), &(crate::units::MAX_AMOUNT as i64)]),
        ));
    }
    Ok(crate::each_kind!(Limit => Limit, item, i => Item { limits: i.limits.scaled(m), ..i }))
}
