//! Arguments as the engines hand them over, parsed into typed values at the edge.
//!
//! Both engines convert their values into [`Arg`] and call the parsers here, so a rule
//! and its error text exist once. The argument count is checked before, against the
//! function's descriptor ([`crate::functions`]).

use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::messages as msg;
use crate::units::{
    Period, MAX_AMOUNT, MAX_DURATION_SECONDS, MAX_JSON_BYTES, MAX_KEY_BYTES, MAX_NOW_MS, MAX_TOKENS, MICROS_PER_UNIT,
    POLICY_KEY_MARK,
};

/// One SQL argument value, borrowed from the engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    /// Bytes that are not (or not known to be) UTF-8 text, e.g. a SQLite BLOB.
    Blob(&'a [u8]),
    /// A boolean, array or object inside a JSON argument, as an error shows it (`true`,
    /// `false`, `a JSON array`, `a JSON object`): no number, key or period.
    Json(&'static str),
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
            Arg::Blob([_]) => "a blob of 1 byte".into(),
            Arg::Blob(b) => format!("a blob of {} bytes", b.len()),
            Arg::Json(shown) => (*shown).into(),
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
pub(crate) fn as_number(arg: &Arg) -> Option<f64> {
    match *arg {
        Arg::Integer(i) => Some(i as f64),
        Arg::Real(r) => Some(r),
        Arg::Text(t) => parse_decimal_text(t),
        Arg::Null | Arg::Blob(_) | Arg::Json(_) => None,
    }
}

/// An integer given as one, or as a real or text without a fraction.
pub(crate) fn as_integer(arg: &Arg) -> Option<i64> {
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
        _ => Err(Error::invalid(msg::NOT_POSITIVE.render(&[&name, &arg.describe()]))),
    }
}

/// A bucket's burst, refill_per_minute or cost: a finite number greater than 0 and at most
/// [`MAX_TOKENS`], where token counts stop being exact.
pub fn token_number(name: &str, arg: &Arg) -> Result<f64> {
    let value = positive_number(name, arg)?;
    if value > MAX_TOKENS {
        return Err(Error::invalid(msg::AT_MOST.render(&[&name, &(MAX_TOKENS as i64), &arg.describe()])));
    }
    Ok(value)
}

/// A cost that may be 0 (the peeks: what is left, with no hypothetical charge).
fn peek_cost(arg: &Arg) -> Option<f64> {
    as_number(arg).filter(|v| *v == 0.0)
}

fn zero_error(name: &str, arg: &Arg) -> Error {
    Error::invalid(msg::NOT_AT_LEAST_ZERO.render(&[&name, &arg.describe()]))
}

/// What a call may be charged: a positive number, or 0 too where `zero` (the peeks).
pub(crate) fn cost_number(name: &str, arg: &Arg, zero: bool) -> Result<f64> {
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
pub(crate) fn cost_micros(name: &str, arg: &Arg, zero: bool) -> Result<i64> {
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
        return Err(Error::invalid(msg::AT_MOST.render(&[&name, &(MAX_AMOUNT as i64), &arg.describe()])));
    }
    // Below a millionth would round up to one: refused as the text says, never rounded up.
    if value < 1.0 / MICROS_PER_UNIT as f64 {
        return Err(Error::invalid(msg::BELOW_A_MILLIONTH.render(&[&name, &arg.describe()])));
    }
    let micros = match *arg {
        Arg::Integer(i) => i * MICROS_PER_UNIT,
        Arg::Text(t) => decimal_text_micros(t.trim()).unwrap_or_else(|| round_micros(value)),
        _ => round_micros(value),
    };
    if micros < 1 {
        return Err(Error::invalid(msg::BELOW_A_MILLIONTH.render(&[&name, &arg.describe()])));
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
        return Err(Error::invalid(msg::POLICY_KEY.template));
    }
    Ok(key)
}

/// A name (a key, a policy, a subject): non-empty text of at most [`MAX_KEY_BYTES`] bytes.
pub fn name<'a>(what: &str, arg: &Arg<'a>) -> Result<&'a str> {
    match *arg {
        Arg::Text("") => Err(Error::invalid(msg::EMPTY.render(&[&what]))),
        Arg::Text(t) if t.len() > MAX_KEY_BYTES => {
            Err(Error::invalid(msg::NAME_TOO_LONG.render(&[&what, &MAX_KEY_BYTES, &t.len()])))
        }
        Arg::Text(t) => Ok(t),
        _ => Err(Error::invalid(msg::NOT_TEXT.render(&[&what, &arg.describe()]))),
    }
}

/// A length of time in seconds (window_seconds, lease_seconds): a finite number greater
/// than 0 and at most a year, as whole milliseconds (rounded, at least 1).
pub fn duration_ms(name: &str, arg: &Arg) -> Result<i64> {
    let seconds = positive_number(name, arg)?;
    if seconds > MAX_DURATION_SECONDS {
        return Err(Error::invalid(msg::DURATION_TOO_LONG.render(&[
            &name,
            &(MAX_DURATION_SECONDS as i64),
            &arg.describe(),
        ])));
    }
    Ok(((seconds * 1000.0).round() as i64).max(1))
}

/// An integer from 1 to `max`.
pub(crate) fn whole_number(name: &str, arg: &Arg, max: i64) -> Result<i64> {
    match as_integer(arg) {
        Some(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(Error::invalid(msg::INTEGER_RANGE.render(&[&name, &max, &arg.describe()]))),
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
        _ => Err(Error::invalid(msg::NOW_MS_RANGE.render(&[&MAX_NOW_MS, &arg.describe()]))),
    }
}

/// A row limit: a positive integer; NULL means no limit (i64::MAX).
pub(crate) fn max_rows(arg: &Arg) -> Result<i64> {
    if *arg == Arg::Null {
        return Ok(i64::MAX);
    }
    match as_integer(arg) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(Error::invalid(msg::MAX_ROWS.render(&[&arg.describe()]))),
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

/// A budget period in its text form ([`Period::parse`]): a unit of [`Unit::ALL`], optionally
/// anchored and in a time zone.
pub fn period(arg: &Arg) -> Result<Period> {
    use crate::period::PeriodError;
    let Arg::Text(t) = *arg else { return Err(Error::invalid(msg::PERIOD.render(&[&arg.describe()]))) };
    Period::parse(t).map_err(|e| {
        Error::invalid(match e {
            PeriodError::Unit => msg::PERIOD.render(&[&arg.describe()]),
            PeriodError::Form => msg::PERIOD_FORM.render(&[&arg.describe()]),
            PeriodError::Anchor(unit, given) => {
                msg::PERIOD_ANCHOR.render(&[&unit.with_article(), &unit.anchor_form(), &Arg::Text(&given).describe()])
            }
            PeriodError::Zone(given) => msg::PERIOD_ZONE.render(&[&Arg::Text(&given).describe()]),
        })
    })
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
    Error::invalid(msg::JSON_TOO_LARGE.render(&[&name, &MAX_JSON_BYTES, &bytes]))
}

/// A JSON value as the argument it stands for.
pub fn json_arg(v: &Value) -> Arg<'_> {
    match v {
        Value::Null => Arg::Null,
        Value::String(s) => Arg::Text(s),
        Value::Number(n) => n.as_i64().map_or_else(|| Arg::Real(number_f64(n)), Arg::Integer),
        // booleans, arrays and objects are not numbers, keys or periods
        Value::Bool(true) => Arg::Json("true"),
        Value::Bool(false) => Arg::Json("false"),
        Value::Array(_) => Arg::Json("a JSON array"),
        Value::Object(_) => Arg::Json("a JSON object"),
    }
}

/// A JSON number as a double: one beyond a double's range (kept as its digits) is
/// infinite, so the rule of its field names it.
pub fn number_f64(n: &serde_json::Number) -> f64 {
    n.as_f64().unwrap_or_else(|| n.to_string().parse::<f64>().unwrap_or(f64::NAN))
}

/// An argument of an internal function: a number the extension's own statement passes.
pub fn stored_real(arg: &Arg) -> f64 {
    as_number(arg).unwrap_or(0.0)
}

/// An argument of an internal function: an integer the extension's own statement passes.
pub fn stored_integer(arg: &Arg) -> i64 {
    as_integer(arg).unwrap_or(0)
}
