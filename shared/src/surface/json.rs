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

/// `v` as the integer it is written as: finite, whole and below 9e15 in magnitude (where
/// every whole f64 is exact).
fn whole(v: f64) -> Option<i64> {
    (v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15).then_some(v as i64)
}

/// A string with JSON's escapes.
fn write_str(out: &mut String, s: &str) {
    // serializing a str to a String cannot fail
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

pub fn number_form(v: f64) -> NumberForm {
    if !v.is_finite() {
        NumberForm::Null
    } else if let Some(n) = whole(v) {
        NumberForm::Int(n)
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
            // number_form's forms, written without a String of their own (SQLite's answers
            // are this text: a call writes about ten numbers)
            Json::Number(v) => match whole(*v) {
                Some(n) => out.push_str(itoa::Buffer::new().format(n)),
                None if v.is_finite() => out.push_str(ryu::Buffer::new().format_finite(*v)),
                None => out.push_str("null"),
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_number_form_says() {
        let cases: &[(f64, &str)] = &[
            (3.0, "3"),
            (-0.0, "0"),
            (-42.0, "-42"),
            (0.1, "0.1"),
            (2.5e-7, "2.5e-7"),
            (8_999_999_999_999_998.0, "8999999999999998"),
            (9.0e15, "9000000000000000.0"),
            (1e300, "1e300"),
            (f64::NAN, "null"),
            (f64::INFINITY, "null"),
        ];
        for &(v, text) in cases {
            assert_eq!(Json::Number(v).to_text(), text, "{v}");
            let form = match number_form(v) {
                NumberForm::Int(n) => n.to_string(),
                NumberForm::Decimal(d) => d,
                NumberForm::Null => "null".into(),
            };
            assert_eq!(form, text, "number_form({v})");
        }
        assert_eq!(Json::Int(i64::MIN).to_text(), i64::MIN.to_string());
    }

    #[test]
    fn strings_and_data_keys_are_escaped() {
        let map = Json::Map(vec![("t\"ier\n".into(), Json::Str("é\u{1}".into()))]);
        assert_eq!(map.to_text(), r#"{"t\"ier\n":"é\u0001"}"#);
        let object = Json::Object(vec![("admitted", Json::Bool(true)), ("items", Json::Array(vec![Json::Null]))]);
        assert_eq!(object.to_text(), r#"{"admitted":true,"items":[null]}"#);
    }
}
