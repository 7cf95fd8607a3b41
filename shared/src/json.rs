//! Numbers in results: whole values print as integers, others in their shortest form.

use crate::args::MICROS_PER_UNIT;
use serde_json::{Number, Value};

/// A limit or level as a JSON number; 3.0 prints as 3.
pub fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::Number(Number::from(v as i64))
    } else {
        Number::from_f64(v).map_or(Value::Null, Value::Number)
    }
}

/// An exact budget amount kept in millionths: 1000000 prints as 1, 300000 as 0.3.
pub fn micros_number(micros: i64) -> Value {
    if micros % MICROS_PER_UNIT == 0 {
        Value::Number(Number::from(micros / MICROS_PER_UNIT))
    } else {
        // At most 6 decimals and |micros| < 2^53, so the shortest f64 form is the exact decimal.
        number(micros as f64 / MICROS_PER_UNIT as f64)
    }
}
