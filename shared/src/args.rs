//! Arguments as the engines hand them over, parsed into typed values at the edge.
//!
//! Both engines convert their values into [`Arg`] and call the parsers here, so a rule
//! and its error text exist once. The argument count is checked before, against the
//! function's descriptor ([`crate::functions`]).

use serde_json::{Map, Value};

use crate::bucket::BucketLimits;
use crate::error::{Error, ErrorKind, Result};
use crate::lease::MAX_IN_FLIGHT;
use crate::multi::{BucketItem, BudgetItem, Limit, WindowItem, MAX_ITEMS};
use crate::penalty::Escalation;
use crate::policy::POLICY_KEY_MARK;
use crate::units::{
    Period, MAX_AMOUNT, MAX_DURATION_SECONDS, MAX_JSON_BYTES, MAX_KEY_BYTES, MAX_NOW_MS, MAX_TOKENS, MICROS_PER_UNIT,
};
use crate::window::WindowLimits;

/// One SQL argument value, borrowed from the engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    /// Bytes that are not (or not known to be) UTF-8 text, e.g. a SQLite BLOB.
    Blob(&'a [u8]),
}

impl Arg<'_> {
    /// How the value is shown in an error message.
    pub fn describe(&self) -> String {
        match self {
            Arg::Null => "NULL".into(),
            Arg::Integer(i) => i.to_string(),
            Arg::Real(r) => format_real(*r),
            Arg::Text(t) => {
                let shown: String = t.chars().take(40).collect();
                let ellipsis = if shown.len() < t.len() { "..." } else { "" };
                format!("'{}{}'", shown.replace('\'', "''"), ellipsis)
            }
            Arg::Blob(b) => format!("a blob of {} bytes", b.len()),
        }
    }
}

/// The argument at `i`; a missing one reads as NULL (the count was checked before).
pub fn nth<'a>(args: &[Arg<'a>], i: usize) -> Arg<'a> {
    args.get(i).copied().unwrap_or(Arg::Null)
}

fn format_real(r: f64) -> String {
    if r.is_nan() {
        "NaN".into()
    } else if r.is_infinite() {
        if r > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else if r != 0.0 && !(1e-6..1e16).contains(&r.abs()) {
        // 1e308 as written, not as 309 digits
        format!("{r:e}")
    } else {
        format!("{r}")
    }
}

/// Checks the argument count of a function with optional trailing arguments.
pub fn arity(got: usize, min: usize, max: usize) -> Result<()> {
    if got < min || got > max {
        let expected = if min == max { min.to_string() } else { format!("{min} to {max}") };
        return Err(Error::invalid(format!("expected {expected} arguments, got {got}")));
    }
    Ok(())
}

/// A number given as an integer, a real, or text that reads as a decimal number.
fn as_number(arg: &Arg) -> Option<f64> {
    match *arg {
        Arg::Integer(i) => Some(i as f64),
        Arg::Real(r) => Some(r),
        Arg::Text(t) => parse_decimal_text(t),
        Arg::Null | Arg::Blob(_) => None,
    }
}

/// An integer given as one, or as a real or text without a fraction.
fn as_integer(arg: &Arg) -> Option<i64> {
    match *arg {
        Arg::Integer(i) => Some(i),
        _ => as_number(arg).filter(|v| v.fract() == 0.0 && v.abs() < 9.0e15).map(|v| v as i64),
    }
}

/// Text that is a plain decimal number (optional sign, digits, point, exponent); words
/// such as 'inf' or 'NaN' are not numbers here.
fn parse_decimal_text(t: &str) -> Option<f64> {
    let t = t.trim();
    let plain = !t.is_empty()
        && t.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'))
        && t.bytes().any(|b| b.is_ascii_digit());
    if plain {
        t.parse::<f64>().ok()
    } else {
        None
    }
}

/// A finite number greater than 0 (burst, refill_per_minute, quota, cost).
pub fn positive_number(name: &str, arg: &Arg) -> Result<f64> {
    match as_number(arg) {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(Error::invalid(format!("{name} must be a finite number greater than 0, got {}", arg.describe()))),
    }
}

/// A bucket's burst, refill_per_minute or cost: a finite number greater than 0 and at most
/// [`MAX_TOKENS`], where token counts stop being exact.
pub fn token_number(name: &str, arg: &Arg) -> Result<f64> {
    let value = positive_number(name, arg)?;
    if value > MAX_TOKENS {
        return Err(Error::invalid(format!("{name} must be at most 1000000000000000, got {}", arg.describe())));
    }
    Ok(value)
}

/// A cost that may be 0 (the peeks: what is left, with no hypothetical charge).
fn peek_cost(arg: &Arg) -> Option<f64> {
    as_number(arg).filter(|v| *v == 0.0)
}

fn zero_error(name: &str, arg: &Arg) -> Error {
    Error::invalid(format!("{name} must be a finite number of at least 0, got {}", arg.describe()))
}

/// What a call may be charged: a positive number, or 0 too where `zero` (the peeks).
fn cost_number(name: &str, arg: &Arg, zero: bool) -> Result<f64> {
    match peek_cost(arg) {
        Some(z) if zero => Ok(z),
        _ if zero => match positive_number(name, arg) {
            Err(_) => Err(zero_error(name, arg)),
            Ok(_) => token_number(name, arg),
        },
        _ => token_number(name, arg),
    }
}

/// A budget cost in millionths, 0 too where `zero` (the peeks).
fn cost_micros(name: &str, arg: &Arg, zero: bool) -> Result<i64> {
    match peek_cost(arg) {
        Some(_) if zero => Ok(0),
        _ if zero && positive_number(name, arg).is_err() => Err(zero_error(name, arg)),
        _ => amount_micros(name, arg),
    }
}

/// A budget amount (quota or cost) as an exact count of millionths.
pub fn amount_micros(name: &str, arg: &Arg) -> Result<i64> {
    let value = positive_number(name, arg)?;
    if value > MAX_AMOUNT {
        return Err(Error::invalid(format!("{name} must be at most 1000000000, got {}", arg.describe())));
    }
    // Below a millionth would round up to one: refused as the text says, never rounded up.
    if value < 1.0 / MICROS_PER_UNIT as f64 {
        return Err(Error::invalid(format!("{name} must be at least 0.000001, got {}", arg.describe())));
    }
    let micros = match *arg {
        Arg::Integer(i) => i * MICROS_PER_UNIT,
        Arg::Text(t) => decimal_text_micros(t.trim()).unwrap_or_else(|| round_micros(value)),
        _ => round_micros(value),
    };
    if micros < 1 {
        return Err(Error::invalid(format!("{name} must be at least 0.000001, got {}", arg.describe())));
    }
    Ok(micros)
}

fn round_micros(value: f64) -> i64 {
    (value * MICROS_PER_UNIT as f64).round() as i64
}

/// Exact millionths of text such as "12.345678"; None for other forms (exponents,
/// more than 6 decimals), which fall back to rounding the parsed number.
fn decimal_text_micros(t: &str) -> Option<i64> {
    let t = t.strip_prefix('+').unwrap_or(t);
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if frac.len() > 6 || !whole.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let frac_micros: i64 = if frac.is_empty() { 0 } else { format!("{frac:0<6}").parse().ok()? };
    whole.checked_mul(MICROS_PER_UNIT)?.checked_add(frac_micros)
}

/// A key: non-empty text of at most [`MAX_KEY_BYTES`] bytes, not starting with the mark
/// of the keys policies derive.
pub fn key<'a>(arg: &Arg<'a>) -> Result<&'a str> {
    let key = name("key", arg)?;
    if key.starts_with(POLICY_KEY_MARK) {
        return Err(Error::invalid("key must not start with U+0001, which marks the keys of policies"));
    }
    Ok(key)
}

/// A name (a key, a policy, a subject): non-empty text of at most [`MAX_KEY_BYTES`] bytes.
pub fn name<'a>(what: &str, arg: &Arg<'a>) -> Result<&'a str> {
    match *arg {
        Arg::Text("") => Err(Error::invalid(format!("{what} must not be empty"))),
        Arg::Text(t) if t.len() > MAX_KEY_BYTES => {
            Err(Error::invalid(format!("{what} must be at most {MAX_KEY_BYTES} bytes, got {} bytes", t.len())))
        }
        Arg::Text(t) => Ok(t),
        _ => Err(Error::invalid(format!("{what} must be text, got {}", arg.describe()))),
    }
}

/// A length of time in seconds (window_seconds, lease_seconds): a finite number greater
/// than 0 and at most a year, as whole milliseconds (rounded, at least 1).
pub fn duration_ms(name: &str, arg: &Arg) -> Result<i64> {
    let seconds = positive_number(name, arg)?;
    if seconds > MAX_DURATION_SECONDS {
        return Err(Error::invalid(format!(
            "{name} must be at most {MAX_DURATION_SECONDS} (one year), got {}",
            arg.describe()
        )));
    }
    Ok(((seconds * 1000.0).round() as i64).max(1))
}

/// An integer from 1 to `max`.
fn whole_number(name: &str, arg: &Arg, max: i64) -> Result<i64> {
    match as_integer(arg) {
        Some(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!("{name} must be an integer from 1 to {max}, got {}", arg.describe()))),
    }
}

/// Where the clock reading of a call comes from.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// The engine's real time, epoch milliseconds.
    pub wall_ms: i64,
    /// Whether the caller may pass its own now_ms (PostgreSQL makes this a superuser setting).
    pub explicit_allowed: bool,
}

impl Clock {
    pub fn system(explicit_allowed: bool) -> Self {
        Clock { wall_ms: wall_clock_ms(), explicit_allowed }
    }
}

/// The machine's real time in epoch milliseconds (clock_timestamp() semantics).
pub fn wall_clock_ms() -> i64 {
    let since_epoch =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    since_epoch.min(MAX_NOW_MS)
}

/// An explicit now_ms: an integer from 0 to [`MAX_NOW_MS`]. None when absent or NULL.
pub fn explicit_now_ms(arg: &Arg) -> Result<Option<i64>> {
    if *arg == Arg::Null {
        return Ok(None);
    }
    match as_integer(arg) {
        Some(ms) if (0..=MAX_NOW_MS).contains(&ms) => Ok(Some(ms)),
        _ => Err(Error::invalid(format!(
            "now_ms must be an integer number of epoch milliseconds from 0 to {MAX_NOW_MS}, got {}",
            arg.describe()
        ))),
    }
}

/// A row limit: a positive integer; NULL means no limit (i64::MAX).
fn max_rows(arg: &Arg) -> Result<i64> {
    if *arg == Arg::Null {
        return Ok(i64::MAX);
    }
    match as_integer(arg) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(Error::invalid(format!("max_rows must be a positive integer, got {}", arg.describe()))),
    }
}

/// The clock reading a call runs at: its explicit now_ms when given and allowed, else real time.
pub fn now_ms(arg: &Arg, clock: &Clock) -> Result<i64> {
    match explicit_now_ms(arg)? {
        None => Ok(clock.wall_ms),
        Some(_) if !clock.explicit_allowed => Err(Error::new(
            ErrorKind::ClockNotAllowed,
            "an explicit now_ms is not allowed unless pg_ratelimit.allow_explicit_clock is on",
        )),
        Some(ms) => Ok(ms),
    }
}

/// A budget period: 'day' or 'month'.
pub fn period(arg: &Arg) -> Result<Period> {
    match *arg {
        Arg::Text(t) => Period::ALL.into_iter().find(|p| p.as_str() == t),
        _ => None,
    }
    .ok_or_else(|| Error::invalid(format!("period must be 'day' or 'month', got {}", arg.describe())))
}

/// `(key, burst, refill_per_minute [, cost = 1 [, now_ms]])` of rl_take and rl_peek, and
/// `(key, burst, refill_per_minute, amount [, now_ms])` of rl_refund.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeArgs<'a> {
    pub key: &'a str,
    pub limits: BucketLimits,
    /// The tokens to take (rl_take, rl_peek) or give back (rl_refund).
    pub cost: f64,
    pub now_ms: i64,
}

impl<'a> TakeArgs<'a> {
    /// `fourth` names the fourth argument in errors: `cost`, or `amount` for rl_refund.
    pub fn parse(fourth: &str, args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        Self::parse_cost(fourth, args, false, clock)
    }

    /// rl_peek's arguments: a cost of 0 reads what is left.
    pub fn parse_peek(args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        Self::parse_cost("cost", args, true, clock)
    }

    fn parse_cost(fourth: &str, args: &[Arg<'a>], zero: bool, clock: &Clock) -> Result<Self> {
        Ok(TakeArgs {
            key: key(&nth(args, 0))?,
            limits: BucketLimits {
                burst: token_number("burst", &nth(args, 1))?,
                refill_per_minute: token_number("refill_per_minute", &nth(args, 2))?,
            },
            cost: match args.get(3) {
                None => 1.0,
                Some(a) => cost_number(fourth, a, zero)?,
            },
            now_ms: now_ms(&nth(args, 4), clock)?,
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
    /// `peek`: rl_budget, where a cost of 0 reads what is left.
    pub fn parse(args: &[Arg<'a>], peek: bool, clock: &Clock) -> Result<Self> {
        Ok(SpendArgs {
            key: key(&nth(args, 0))?,
            period: period(&nth(args, 1))?,
            quota: amount_micros("quota", &nth(args, 2))?,
            cost: match args.get(3) {
                None => MICROS_PER_UNIT,
                Some(a) => cost_micros("cost", a, peek)?,
            },
            now_ms: now_ms(&nth(args, 4), clock)?,
        })
    }
}

/// `(key, period, amount [, now_ms])` of rl_refund_budget.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundBudgetArgs<'a> {
    pub key: &'a str,
    pub period: Period,
    /// Millionths.
    pub amount: i64,
    pub now_ms: i64,
}

impl<'a> RefundBudgetArgs<'a> {
    pub fn parse(args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        Ok(RefundBudgetArgs {
            key: key(&nth(args, 0))?,
            period: period(&nth(args, 1))?,
            amount: amount_micros("amount", &nth(args, 2))?,
            now_ms: now_ms(&nth(args, 3), clock)?,
        })
    }
}

/// `(key, limit, window_seconds [, cost = 1 [, now_ms]])` of rl_window and rl_window_peek.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowArgs<'a> {
    pub key: &'a str,
    pub limits: WindowLimits,
    /// Millionths.
    pub cost: i64,
    pub now_ms: i64,
}

impl<'a> WindowArgs<'a> {
    /// `peek`: rl_window_peek, where a cost of 0 reads what is left.
    pub fn parse(args: &[Arg<'a>], peek: bool, clock: &Clock) -> Result<Self> {
        Ok(WindowArgs {
            key: key(&nth(args, 0))?,
            limits: WindowLimits {
                limit: amount_micros("limit", &nth(args, 1))?,
                window_ms: duration_ms("window_seconds", &nth(args, 2))?,
            },
            cost: match args.get(3) {
                None => MICROS_PER_UNIT,
                Some(a) => cost_micros("cost", a, peek)?,
            },
            now_ms: now_ms(&nth(args, 4), clock)?,
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
    pub fn parse(args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        Ok(AcquireArgs {
            key: key(&nth(args, 0))?,
            max_in_flight: whole_number("max_in_flight", &nth(args, 1), MAX_IN_FLIGHT)?,
            lease_ms: duration_ms("lease_seconds", &nth(args, 2))?,
            now_ms: now_ms(&nth(args, 3), clock)?,
        })
    }
}

/// `(key, lease [, now_ms])` of rl_release, and `(key, lease, lease_seconds [, now_ms])`
/// of rl_renew (lease_ms None for rl_release).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseArgs<'a> {
    pub key: &'a str,
    pub lease: &'a str,
    pub lease_ms: Option<i64>,
    pub now_ms: i64,
}

impl<'a> LeaseArgs<'a> {
    pub fn parse(args: &[Arg<'a>], renew: bool, clock: &Clock) -> Result<Self> {
        let key = key(&nth(args, 0))?;
        let lease = match nth(args, 1) {
            Arg::Text(t) => t,
            other => return Err(Error::invalid(format!("lease must be text, got {}", other.describe()))),
        };
        let lease_ms = if renew { Some(duration_ms("lease_seconds", &nth(args, 2))?) } else { None };
        Ok(LeaseArgs { key, lease, lease_ms, now_ms: now_ms(&nth(args, if renew { 3 } else { 2 }), clock)? })
    }
}

/// `(policy, subject [, cost = 1 [, tier [, now_ms]]])` of rl_check.
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
    pub fn parse(args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        let policy = name("policy", &nth(args, 0))?;
        let subject = name("subject", &nth(args, 1))?;
        Ok(CheckArgs {
            policy,
            subject,
            cost: match args.get(2) {
                None => 1.0,
                // the budget rules: exact millionths, 0.000001 to 1,000,000,000
                Some(a) => amount_micros("cost", a)? as f64 / MICROS_PER_UNIT as f64,
            },
            tier: match nth(args, 3) {
                Arg::Null => None,
                tier => Some(name("tier", &tier)?),
            },
            now_ms: now_ms(&nth(args, 4), clock)?,
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
    pub fn parse(args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        let or_default = |i: usize, default: i64| match args.get(i) {
            None => Ok(default),
            Some(a) => duration_ms(["", "", "base_seconds", "max_seconds", "window_seconds"][i], a),
        };
        Ok(PenalizeArgs {
            subject: name("subject", &nth(args, 0))?,
            escalation: Escalation {
                free_strikes: match args.get(1) {
                    None => 3,
                    Some(a) => match as_integer(a) {
                        Some(n) if (0..=1_000_000).contains(&n) => n,
                        _ => {
                            return Err(Error::invalid(format!(
                                "free_strikes must be an integer from 0 to 1000000, got {}",
                                a.describe()
                            )))
                        }
                    },
                },
                base_ms: or_default(2, 60_000)?,
                max_ms: or_default(3, 3_600_000)?,
                window_ms: or_default(4, 3_600_000)?,
            },
            now_ms: now_ms(&nth(args, 5), clock)?,
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
    pub fn parse(args: &[Arg<'a>], clock: &Clock) -> Result<Self> {
        Ok(BlockArgs {
            subject: name("subject", &nth(args, 0))?,
            length_ms: match nth(args, 1) {
                Arg::Null => None,
                a => Some(duration_ms("seconds", &a)?),
            },
            now_ms: now_ms(&nth(args, 2), clock)?,
        })
    }
}

/// `(key [, now_ms])` of rl_in_flight.
pub fn key_at<'a>(args: &[Arg<'a>], clock: &Clock) -> Result<(&'a str, i64)> {
    Ok((key(&nth(args, 0))?, now_ms(&nth(args, 1), clock)?))
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
    pub fn parse(args: &[Arg], clock: &Clock) -> Result<Self> {
        let requested = explicit_now_ms(&nth(args, 0))?.unwrap_or(clock.wall_ms);
        Ok(SweepArgs { cutoff_ms: requested.min(clock.wall_ms), max_rows: max_rows(&nth(args, 1))? })
    }
}

/// `(limits [, now_ms])` of rl_take_all: the limits in the order their rows are read.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeAllArgs<'a> {
    pub limits: Vec<Limit<'a>>,
    pub now_ms: i64,
}

/// The JSON argument of rl_take_all as a value, which [`TakeAllArgs`] borrows its keys from.
pub fn limits_json(arg: &Arg) -> Result<Value> {
    match *arg {
        Arg::Text(t) => json_value("limits", t),
        _ => Err(Error::invalid(format!("limits must be a JSON array, got {}", arg.describe()))),
    }
}

/// A JSON argument parsed, after its size is checked (so no call parses more than
/// [`MAX_JSON_BYTES`]). A number too large for a double reads as infinite, which the
/// field's own rule then refuses by name.
pub fn json_value(name: &str, text: &str) -> Result<Value> {
    json_size(name, text.len())?;
    serde_json::from_str(text).map_err(|e| Error::invalid(format!("{name} must be valid JSON: {e}")))
}

/// Refuses a JSON argument of more than [`MAX_JSON_BYTES`] (an engine that can tell the
/// size before converting the value checks it first).
pub fn json_size(name: &str, bytes: usize) -> Result<()> {
    if bytes > MAX_JSON_BYTES {
        return Err(json_too_large(name, bytes));
    }
    Ok(())
}

/// The error of a JSON argument of more than [`MAX_JSON_BYTES`] (`bytes`: as far as it was read).
pub fn json_too_large(name: &str, bytes: usize) -> Error {
    Error::invalid(format!("{name} must be at most {MAX_JSON_BYTES} bytes of JSON, got {bytes} bytes"))
}

impl<'a> TakeAllArgs<'a> {
    pub fn parse(json: &'a Value, now_arg: &Arg, clock: &Clock) -> Result<Self> {
        let now_ms = now_ms(now_arg, clock)?;
        let list = json.as_array().ok_or_else(|| Error::invalid("limits must be a JSON array of limit objects"))?;
        if list.is_empty() || list.len() > MAX_ITEMS {
            return Err(Error::invalid(format!("limits must hold 1 to {MAX_ITEMS} items, got {}", list.len())));
        }
        let mut limits = list
            .iter()
            .enumerate()
            .map(|(i, v)| limit(i, v).map_err(|e| Error::invalid(format!("item {}: {}", i + 1, e.message))))
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

/// A JSON value as the argument it stands for.
pub fn json_arg(v: &Value) -> Arg<'_> {
    match v {
        Value::Null => Arg::Null,
        Value::String(s) => Arg::Text(s),
        Value::Number(n) => n.as_i64().map_or_else(|| Arg::Real(number_f64(n)), Arg::Integer),
        // booleans, arrays and objects are not numbers, keys or periods
        other => Arg::Blob(if other.is_boolean() { b"boolean" } else { b"json" }),
    }
}

/// A JSON number as a double: one beyond a double's range (kept as its digits) is
/// infinite, so the rule of its field names it.
pub fn number_f64(n: &serde_json::Number) -> f64 {
    n.as_f64().unwrap_or_else(|| n.to_string().parse::<f64>().unwrap_or(f64::NAN))
}

fn limit<'a>(position: usize, v: &'a Value) -> Result<Limit<'a>> {
    let o: &Map<String, Value> = v.as_object().ok_or_else(|| Error::invalid("must be a JSON object"))?;
    let is_budget = o.contains_key("period");
    let is_window = !is_budget && o.contains_key("window_seconds");
    let allowed: &[&str] = if is_budget {
        &["key", "period", "quota", "cost"]
    } else if is_window {
        &["key", "limit", "window_seconds", "cost"]
    } else {
        &["key", "burst", "refill_per_minute", "cost"]
    };
    if let Some(extra) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(Error::invalid(
            format!(
                "unknown field \"{extra}\" (a bucket has key, burst, refill_per_minute, cost; a budget key, period, quota, cost; a window key, limit, window_seconds, cost)"
            ),
        ));
    }
    let field = |name: &str| o.get(name).map_or(Arg::Null, json_arg);
    let key = key(&field("key"))?;
    let cost = o.get("cost").map(json_arg);
    if is_window {
        return Ok(Limit::Window(WindowItem {
            position,
            key,
            limits: WindowLimits {
                limit: amount_micros("limit", &field("limit"))?,
                window_ms: duration_ms("window_seconds", &field("window_seconds"))?,
            },
            cost: cost.map_or(Ok(MICROS_PER_UNIT), |c| amount_micros("cost", &c))?,
        }));
    }
    if is_budget {
        Ok(Limit::Budget(BudgetItem {
            position,
            key,
            period: period(&field("period"))?,
            quota: amount_micros("quota", &field("quota"))?,
            cost: cost.map_or(Ok(MICROS_PER_UNIT), |c| amount_micros("cost", &c))?,
        }))
    } else {
        Ok(Limit::Bucket(BucketItem {
            position,
            key,
            limits: BucketLimits {
                burst: token_number("burst", &field("burst"))?,
                refill_per_minute: token_number("refill_per_minute", &field("refill_per_minute"))?,
            },
            cost: cost.map_or(Ok(1.0), |c| token_number("cost", &c))?,
        }))
    }
}

/// An argument of an internal function: a number the extension's own statement passes.
pub fn stored_real(arg: &Arg) -> f64 {
    as_number(arg).unwrap_or(0.0)
}

/// An argument of an internal function: an integer the extension's own statement passes.
pub fn stored_integer(arg: &Arg) -> i64 {
    as_integer(arg).unwrap_or(0)
}
