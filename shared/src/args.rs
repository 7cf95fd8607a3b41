//! Arguments as the engines hand them over, and the validation every function shares.
//!
//! Both engines convert their values into [`Arg`] and call the parsers here, so a rule
//! and its error text exist once.

use crate::budget::Period;
use crate::error::{Error, Result};

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Latest clock reading accepted: 9999-12-31T23:59:59.999Z. Keeps every derived time
/// (period ends, retry times) far from integer overflow and inside calendar range.
pub const MAX_NOW_MS: i64 = 253_402_300_799_999;

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

fn format_real(r: f64) -> String {
    if r.is_nan() {
        "NaN".into()
    } else if r.is_infinite() {
        if r > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else {
        format!("{r}")
    }
}

/// Checks the argument count of a function with optional trailing arguments.
pub fn arity(function: &'static str, got: usize, min: usize, max: usize) -> Result<()> {
    if got < min || got > max {
        let expected = if min == max { min.to_string() } else { format!("{min} to {max}") };
        return Err(Error::invalid(function, format!("expected {expected} arguments, got {got}")));
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
pub fn positive_number(function: &'static str, name: &str, arg: &Arg) -> Result<f64> {
    match as_number(arg) {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(Error::invalid(
            function,
            format!("{name} must be a finite number greater than 0, got {}", arg.describe()),
        )),
    }
}

/// Largest budget quota or cost. Amounts are integer millionths; below 2^53 millionths
/// every amount and every sum of two is exact in f64 and in any JSON reader.
pub const MAX_AMOUNT: f64 = 1e9;
/// Budget amounts are counted in millionths, so costs with up to 6 decimals are exact.
pub const MICROS_PER_UNIT: i64 = 1_000_000;

/// A budget amount (quota or cost) as an exact count of millionths.
pub fn amount_micros(function: &'static str, name: &str, arg: &Arg) -> Result<i64> {
    let value = positive_number(function, name, arg)?;
    if value > MAX_AMOUNT {
        return Err(Error::invalid(function, format!("{name} must be at most 1000000000, got {}", arg.describe())));
    }
    let micros = match *arg {
        Arg::Integer(i) => i * MICROS_PER_UNIT,
        Arg::Text(t) => decimal_text_micros(t.trim()).unwrap_or_else(|| round_micros(value)),
        _ => round_micros(value),
    };
    if micros < 1 {
        return Err(Error::invalid(function, format!("{name} must be at least 0.000001, got {}", arg.describe())));
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

/// A key: non-empty text of at most [`MAX_KEY_BYTES`] bytes.
pub fn key<'a>(function: &'static str, arg: &Arg<'a>) -> Result<&'a str> {
    match *arg {
        Arg::Text(t) if t.is_empty() => Err(Error::invalid(function, "key must not be empty")),
        Arg::Text(t) if t.len() > MAX_KEY_BYTES => {
            Err(Error::invalid(function, format!("key must be at most {MAX_KEY_BYTES} bytes, got {} bytes", t.len())))
        }
        Arg::Text(t) => Ok(t),
        _ => Err(Error::invalid(function, format!("key must be text, got {}", arg.describe()))),
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
pub fn explicit_now_ms(function: &'static str, arg: Option<&Arg>) -> Result<Option<i64>> {
    let arg = match arg {
        None | Some(Arg::Null) => return Ok(None),
        Some(a) => a,
    };
    let value = match *arg {
        Arg::Integer(i) => Some(i),
        _ => as_number(arg).filter(|v| v.fract() == 0.0 && v.abs() < 9.0e15).map(|v| v as i64),
    };
    match value {
        Some(ms) if (0..=MAX_NOW_MS).contains(&ms) => Ok(Some(ms)),
        _ => Err(Error::invalid(
            function,
            format!(
                "now_ms must be an integer number of epoch milliseconds from 0 to {MAX_NOW_MS}, got {}",
                arg.describe()
            ),
        )),
    }
}

/// A row limit: a positive integer; absent or NULL means no limit (i64::MAX).
pub fn max_rows(function: &'static str, arg: Option<&Arg>) -> Result<i64> {
    let arg = match arg {
        None | Some(Arg::Null) => return Ok(i64::MAX),
        Some(a) => a,
    };
    let value = match *arg {
        Arg::Integer(i) => Some(i),
        _ => as_number(arg).filter(|v| v.fract() == 0.0 && v.abs() < 9.0e15).map(|v| v as i64),
    };
    match value {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(Error::invalid(function, format!("max_rows must be a positive integer, got {}", arg.describe()))),
    }
}

/// The clock reading a call runs at: its explicit now_ms when given and allowed, else real time.
pub fn now_ms(function: &'static str, arg: Option<&Arg>, clock: &Clock) -> Result<i64> {
    match explicit_now_ms(function, arg)? {
        None => Ok(clock.wall_ms),
        Some(_) if !clock.explicit_allowed => Err(Error {
            kind: crate::error::ErrorKind::ClockNotAllowed,
            function,
            message: "an explicit now_ms is not allowed unless pg_ratelimit.allow_explicit_clock is on".into(),
            engine_code: None,
        }),
        Some(ms) => Ok(ms),
    }
}

/// A budget period: 'day' or 'month'.
pub fn period(function: &'static str, arg: &Arg) -> Result<Period> {
    match *arg {
        Arg::Text("day") => Ok(Period::Day),
        Arg::Text("month") => Ok(Period::Month),
        _ => Err(Error::invalid(function, format!("period must be 'day' or 'month', got {}", arg.describe()))),
    }
}
