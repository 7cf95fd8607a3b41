//! The core's JSON value ([`Json`]) and how numbers are written: whole numbers as
//! integers (3.0 as 3), others in their shortest exact form. A leaf: the modules that
//! build answers ([`crate::render`], [`crate::policy`], [`crate::headers`],
//! [`crate::stats`]) use it, and it uses none of them.

use crate::units::MICROS_PER_UNIT;

/// A result as the core answers it. Each engine writes it its own way: SQLite as text
/// ([`Json::to_text`]), PostgreSQL straight into `jsonb`, so no text is printed to be
/// parsed again.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    /// A limit, level or amount: written as [`number_form`] says.
    Number(f64),
    Array(Vec<Json>),
    /// Keys are the contract's own names: plain ASCII that needs no escaping.
    Object(Vec<(&'static str, Json)>),
    /// An object whose keys are data (a policy's tier names), written with JSON escapes.
    Map(Vec<(String, Json)>),
    /// A string value (written with JSON escapes).
    Str(String),
}

/// `{"key":value,...}`, the keys written with JSON escapes if `escape_keys`.
fn write_object<'j>(out: &mut String, fields: impl Iterator<Item = (&'j str, &'j Json)>, escape_keys: bool) {
    out.push('{');
    for (i, (key, value)) in fields.enumerate() {
        if i > 0 {
            out.push(',');
        }
        match escape_keys {
            true => write_str(out, key),
            false => {
                out.push('"');
                out.push_str(key);
                out.push('"');
            }
        }
        out.push(':');
        value.write(out);
    }
    out.push('}');
}

/// How a number is written: whole numbers as integers (3.0 as 3), others in their shortest
/// exact decimal form, a non-finite one as null.
#[derive(Debug, Clone, PartialEq)]
pub enum NumberForm {
    Int(i64),
    Decimal(String),
    Null,
}

/// Whole numbers below this magnitude are written as integers (every one is exact in f64).
const WHOLE_BELOW: f64 = 9.0e15;

/// A string with JSON's escapes.
fn write_str(out: &mut String, s: &str) {
    // serializing a str to a String cannot fail
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

pub fn number_form(v: f64) -> NumberForm {
    if !v.is_finite() {
        NumberForm::Null
    } else if v.fract() == 0.0 && v.abs() < WHOLE_BELOW {
        NumberForm::Int(v as i64)
    } else {
        NumberForm::Decimal(ryu::Buffer::new().format_finite(v).to_owned())
    }
}

impl Json {
    /// An exact budget amount kept in millionths: 1000000 is 1, 300000 is 0.3.
    pub fn micros(micros: i64) -> Json {
        if micros % MICROS_PER_UNIT == 0 {
            Json::Int(micros / MICROS_PER_UNIT)
        } else {
            // Amounts stay below 2^53 millionths, so the shortest f64 form is the exact decimal.
            Json::Number(micros as f64 / MICROS_PER_UNIT as f64)
        }
    }

    pub fn to_text(&self) -> String {
        let mut out = String::with_capacity(192);
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Str(s) => write_str(out, s),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(n) => out.push_str(itoa::Buffer::new().format(*n)),
            // number_form's rule, written without a String of its own (SQLite's answers
            // are this text: a call writes about ten numbers)
            Json::Number(v) if !v.is_finite() => out.push_str("null"),
            Json::Number(v) if v.fract() == 0.0 && v.abs() < WHOLE_BELOW => {
                out.push_str(itoa::Buffer::new().format(*v as i64))
            }
            Json::Number(v) => out.push_str(ryu::Buffer::new().format_finite(*v)),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            // the contract's keys need no escaping; a map's keys are data
            Json::Object(fields) => write_object(out, fields.iter().map(|(k, v)| (*k, v)), false),
            Json::Map(fields) => write_object(out, fields.iter().map(|(k, v)| (k.as_str(), v)), true),
        }
    }
}

/// A number as JSON text (for header values).
pub fn number_text(v: f64) -> String {
    Json::Number(v).to_text()
}
