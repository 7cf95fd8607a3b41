//! Results as JSON text, written straight into one string: whole numbers print as
//! integers (3.0 as 3), other numbers in their shortest exact form, keys in contract order.

use crate::args::MICROS_PER_UNIT;
use std::fmt::Write;

/// A JSON object under construction.
pub struct JsonObject {
    out: String,
}

impl Default for JsonObject {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonObject {
    pub fn new() -> Self {
        let mut out = String::with_capacity(192);
        out.push('{');
        JsonObject { out }
    }

    /// Keys are the contract's own names: plain ASCII that needs no escaping.
    fn key(&mut self, key: &str) {
        if self.out.len() > 1 {
            self.out.push(',');
        }
        self.out.push('"');
        self.out.push_str(key);
        self.out.push_str("\":");
    }

    pub fn bool(mut self, key: &str, v: bool) -> Self {
        self.key(key);
        self.out.push_str(if v { "true" } else { "false" });
        self
    }

    pub fn int(mut self, key: &str, v: i64) -> Self {
        self.key(key);
        let _ = write!(self.out, "{v}");
        self
    }

    /// A limit or level: 3.0 prints as 3, 0.1 as 0.1.
    pub fn number(mut self, key: &str, v: f64) -> Self {
        self.key(key);
        write_number(&mut self.out, v);
        self
    }

    /// An exact budget amount kept in millionths: 1000000 prints as 1, 300000 as 0.3.
    pub fn micros(mut self, key: &str, micros: i64) -> Self {
        self.key(key);
        if micros % MICROS_PER_UNIT == 0 {
            let _ = write!(self.out, "{}", micros / MICROS_PER_UNIT);
        } else {
            // Amounts stay below 2^53 millionths, so the shortest f64 form is the exact decimal.
            write_number(&mut self.out, micros as f64 / MICROS_PER_UNIT as f64);
        }
        self
    }

    /// A value that already is JSON text.
    pub fn raw(mut self, key: &str, json: &str) -> Self {
        self.key(key);
        self.out.push_str(json);
        self
    }

    pub fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

fn write_number(out: &mut String, v: f64) {
    if !v.is_finite() {
        out.push_str("null");
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        out.push_str(ryu::Buffer::new().format_finite(v));
    }
}

/// A number as JSON text (for header values).
pub fn number_text(v: f64) -> String {
    let mut out = String::new();
    write_number(&mut out, v);
    out
}
