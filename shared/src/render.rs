//! Results as JSON text, written straight into one string at the edge: whole numbers
//! print as integers (3.0 as 3), other numbers in their shortest exact form, keys in the
//! order of each function's `result_keys` ([`crate::functions`]).

use std::fmt::Write;

use crate::bucket::{RefundDecision, TakeDecision};
use crate::budget::{BudgetRefund, SpendDecision};
use crate::memory::MemoryStats;
use crate::multi::{ItemAnswer, TakeAllDecision};
use crate::units::{ceil_seconds, MICROS_PER_UNIT};

/// A result that SQL callers receive as a JSON object.
pub trait ToJson {
    fn to_json(&self) -> String;
}

impl ToJson for TakeDecision {
    fn to_json(&self) -> String {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .int("remaining", self.remaining)
            .number("limit", self.limit)
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .int("reset_after_seconds", ceil_seconds(self.reset_after_ms))
            .finish()
    }
}

impl ToJson for MemoryStats {
    fn to_json(&self) -> String {
        JsonObject::new()
            .int("capacity", self.capacity as i64)
            .int("in_use", self.in_use as i64)
            .int("evicted_full", self.evicted_full as i64)
            .int("evicted_early", self.evicted_early as i64)
            .int("saved", self.saved as i64)
            .int("loaded", self.loaded as i64)
            .int("bytes_per_bucket", self.bytes_per_bucket as i64)
            .finish()
    }
}

impl ToJson for RefundDecision {
    fn to_json(&self) -> String {
        JsonObject::new()
            .int("remaining", self.remaining)
            .number("limit", self.limit)
            .int("reset_after_seconds", ceil_seconds(self.reset_after_ms))
            .finish()
    }
}

impl ToJson for SpendDecision {
    fn to_json(&self) -> String {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .micros("used", self.used)
            .micros("limit", self.quota)
            .micros("remaining", self.quota - self.used)
            .int("resets_at", self.resets_at_ms / 1000)
            .int("retry_after_seconds", self.retry_after_seconds)
            .finish()
    }
}

impl ToJson for BudgetRefund {
    fn to_json(&self) -> String {
        JsonObject::new().micros("used", self.used).int("resets_at", self.resets_at_ms / 1000).finish()
    }
}

impl ToJson for TakeAllDecision<'_, '_> {
    fn to_json(&self) -> String {
        let mut in_given_order: Vec<&ItemAnswer> = self.items.iter().collect();
        in_given_order.sort_by_key(|i| i.position());
        let items: Vec<String> = in_given_order
            .iter()
            .map(|i| match i {
                ItemAnswer::Bucket { answer, .. } => answer.to_json(),
                ItemAnswer::Budget { answer, .. } => answer.to_json(),
            })
            .collect();
        JsonObject::new()
            .bool("admitted", self.admitted)
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .raw("items", &format!("[{}]", items.join(",")))
            .finish()
    }
}

/// A JSON object under construction.
struct JsonObject {
    out: String,
}

impl JsonObject {
    fn new() -> Self {
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

    fn bool(mut self, key: &str, v: bool) -> Self {
        self.key(key);
        self.out.push_str(if v { "true" } else { "false" });
        self
    }

    fn int(mut self, key: &str, v: i64) -> Self {
        self.key(key);
        let _ = write!(self.out, "{v}");
        self
    }

    /// A limit or level: 3.0 prints as 3, 0.1 as 0.1.
    fn number(mut self, key: &str, v: f64) -> Self {
        self.key(key);
        write_number(&mut self.out, v);
        self
    }

    /// An exact budget amount kept in millionths: 1000000 prints as 1, 300000 as 0.3.
    fn micros(mut self, key: &str, micros: i64) -> Self {
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
    fn raw(mut self, key: &str, json: &str) -> Self {
        self.key(key);
        self.out.push_str(json);
        self
    }

    fn finish(mut self) -> String {
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
