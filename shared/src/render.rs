//! Results as JSON values ([`Json`]) that each engine writes its own way: whole numbers
//! as integers (3.0 as 3), other numbers in their shortest exact form, keys in the order
//! of each function's `result_keys` ([`crate::functions`]).

use std::fmt::Write;

use crate::bucket::{RefundDecision, TakeDecision};
use crate::budget::{BudgetCharge, BudgetRefund, SpendDecision};
use crate::lease::{AcquireDecision, RenewDecision};
use crate::memory::MemoryStats;
use crate::multi::{LimitAnswer, TakeAllDecision};
use crate::penalty::{Block, BlockAnswer};
use crate::policy::{CheckDecision, LimitRefund, RefundCheckDecision};
use crate::units::{ceil_seconds, MICROS_PER_UNIT};
use crate::window::WindowDecision;

/// A result that SQL callers receive as a JSON object.
pub trait ToJson {
    fn to_json(&self) -> Json;
}

impl ToJson for TakeDecision {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .int("remaining", self.remaining)
            .number("limit", self.limit)
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .int("reset_after_seconds", ceil_seconds(self.reset_after_ms))
            .bool("exceeds_limit", self.exceeds_limit)
            .number("refill_seconds", self.refill_seconds)
            .finish()
    }
}

impl ToJson for WindowDecision {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .int("remaining", self.remaining)
            .micros("limit", self.limit)
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .int("reset_after_seconds", ceil_seconds(self.reset_after_ms))
            .bool("exceeds_limit", self.exceeds_limit)
            .number("window_seconds", self.window_ms as f64 / 1000.0)
            .finish()
    }
}

impl ToJson for AcquireDecision {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .field("lease", self.lease.map_or(Json::Null, |l| Json::Str(l.id())))
            .int("in_flight", self.in_flight)
            .int("limit", self.limit)
            .field("expires_at", self.lease.map_or(Json::Null, |l| Json::Int(l.expires_at)))
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .finish()
    }
}

impl ToJson for RenewDecision {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("renewed", self.renewed)
            .field("expires_at", self.expires_at.map_or(Json::Null, Json::Int))
            .finish()
    }
}

impl ToJson for BudgetCharge {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", true)
            .micros("used", self.used)
            .int("resets_at", self.resets_at_ms / 1000)
            .finish()
    }
}

impl ToJson for MemoryStats {
    fn to_json(&self) -> Json {
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
    fn to_json(&self) -> Json {
        JsonObject::new()
            .int("remaining", self.remaining)
            .number("limit", self.limit)
            .int("reset_after_seconds", ceil_seconds(self.reset_after_ms))
            .finish()
    }
}

impl ToJson for SpendDecision {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .micros("used", self.used)
            .micros("limit", self.quota)
            .micros("remaining", self.quota - self.used)
            .int("resets_at", self.resets_at_ms / 1000)
            .int("retry_after_seconds", self.retry_after_seconds)
            .bool("exceeds_limit", self.exceeds_limit)
            .int("period_seconds", self.period_ms / 1000)
            .finish()
    }
}

impl ToJson for BudgetRefund {
    fn to_json(&self) -> Json {
        JsonObject::new().micros("used", self.used).int("resets_at", self.resets_at_ms / 1000).finish()
    }
}

impl ToJson for CheckDecision<'_> {
    /// rl_take_all's answer, with the policy's say in `admitted` and the waits: a shadow
    /// policy admits, a block refuses for as long as it lasts.
    fn to_json(&self) -> Json {
        let (admitted, retry) = match (self.shadow, self.blocked) {
            (true, _) => (true, Json::Int(0)),
            (false, None) => (self.limits.admitted, Json::Int(self.limits.retry_after_ms)),
            (false, Some(Block::Until(t))) => (false, Json::Int(t - self.now_ms)),
            (false, Some(Block::Indefinite)) => (false, Json::Null),
        };
        let retry_seconds = match retry {
            Json::Int(ms) => Json::Int(ceil_seconds(ms)),
            _ => Json::Null,
        };
        let items = self.limits.items.iter().map(ToJson::to_json).collect();
        JsonObject::new()
            .bool("admitted", admitted)
            .field("retry_after_ms", retry)
            .field("retry_after_seconds", retry_seconds)
            .field("items", Json::Array(items))
            .field("policy", Json::Str(self.policy.to_owned()))
            .field("tier", optional_text(self.tier))
            .bool("shadow", self.shadow)
            .bool("would_refuse", self.would_refuse())
            .bool("blocked", self.blocked.is_some())
            .finish()
    }
}

impl ToJson for RefundCheckDecision<'_> {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .field("policy", Json::Str(self.policy.to_owned()))
            .field("tier", optional_text(self.tier))
            .field("items", Json::Array(self.items.iter().map(ToJson::to_json).collect()))
            .finish()
    }
}

impl ToJson for LimitRefund {
    fn to_json(&self) -> Json {
        match self {
            LimitRefund::Bucket(d) => d.to_json(),
            LimitRefund::Budget(d) => d.to_json(),
            LimitRefund::Window(d) => d.to_json(),
        }
    }
}

impl ToJson for LimitAnswer {
    fn to_json(&self) -> Json {
        match self {
            LimitAnswer::Bucket(d) => d.to_json(),
            LimitAnswer::Budget(d) => d.to_json(),
            LimitAnswer::Window(d) => d.to_json(),
        }
    }
}

fn optional_text(text: Option<&str>) -> Json {
    text.map_or(Json::Null, |t| Json::Str(t.to_owned()))
}

impl ToJson for BlockAnswer {
    fn to_json(&self) -> Json {
        let (strikes, blocked, until, retry) = self.fields();
        JsonObject::new()
            .int("strikes", strikes)
            .bool("blocked", blocked)
            .field("blocked_until", until.map_or(Json::Null, Json::Int))
            .field("retry_after_seconds", retry.map_or(Json::Null, Json::Int))
            .finish()
    }
}

impl ToJson for TakeAllDecision<'_, '_> {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .field("items", Json::Array(self.answers_in_given_order().map(|a| a.to_json()).collect()))
            .finish()
    }
}

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
            true => out.push_str(&serde_json::Value::String(key.to_owned()).to_string()),
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

pub fn number_form(v: f64) -> NumberForm {
    if !v.is_finite() {
        NumberForm::Null
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
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
            Json::Str(s) => out.push_str(&serde_json::Value::String(s.clone()).to_string()),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Json::Number(v) => match number_form(*v) {
                NumberForm::Int(n) => {
                    let _ = write!(out, "{n}");
                }
                NumberForm::Decimal(d) => out.push_str(&d),
                NumberForm::Null => out.push_str("null"),
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

/// A JSON object under construction.
struct JsonObject {
    fields: Vec<(&'static str, Json)>,
}

impl JsonObject {
    fn new() -> Self {
        // room for the longest answer (rl_take has 8 keys), so building one never reallocates
        JsonObject { fields: Vec::with_capacity(12) }
    }

    fn field(mut self, key: &'static str, value: Json) -> Self {
        self.fields.push((key, value));
        self
    }

    fn bool(self, key: &'static str, v: bool) -> Self {
        self.field(key, Json::Bool(v))
    }

    fn int(self, key: &'static str, v: i64) -> Self {
        self.field(key, Json::Int(v))
    }

    fn number(self, key: &'static str, v: f64) -> Self {
        self.field(key, Json::Number(v))
    }

    fn micros(self, key: &'static str, micros: i64) -> Self {
        self.field(key, Json::micros(micros))
    }

    fn finish(self) -> Json {
        Json::Object(self.fields)
    }
}

/// A number as JSON text (for header values).
pub fn number_text(v: f64) -> String {
    Json::Number(v).to_text()
}
