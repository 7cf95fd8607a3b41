//! Each decision of the core as the JSON answer its SQL function returns ([`ToJson`]),
//! keys in the order of the function's `result_keys` ([`crate::functions`]); the value
//! itself and how numbers are written are [`crate::json`].

use crate::bucket::{RefundDecision, TakeDecision};
use crate::budget::{BudgetCharge, BudgetRefund, BudgetsNear, SpendDecision, Usage, UsagePage, UsagePeriod};
use crate::json::Json;
use crate::lease::{AcquireDecision, RenewDecision};
use crate::memory::MemoryStats;
use crate::penalty::{Block, BlockAnswer};
use crate::policy::{ChargeCheckDecision, CheckDecision, LimitRefund, RefundAllDecision, RefundCheckDecision};
use crate::take_all::{LimitAnswer, TakeAllAnswer, TakeAllDecision};
use crate::units::ceil_seconds;
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
            .int("reset_after_seconds", self.reset_after_seconds)
            .bool("exceeds_limit", self.exceeds_limit)
            .int("period_seconds", self.period_ms / 1000)
            .finish()
    }
}

impl ToJson for BudgetsNear {
    /// rl_budgets_near's answer: amounts in units as rl_spend gives them, resets_at in
    /// epoch seconds.
    fn to_json(&self) -> Json {
        let budgets = self
            .budgets
            .iter()
            .map(|b| {
                JsonObject::new()
                    .field("key", Json::Str(b.key.clone()))
                    .field("period", Json::Str(b.period.clone()))
                    .micros("used", b.used)
                    .micros("quota", b.quota)
                    .int("resets_at", b.resets_at / 1000)
                    .finish()
            })
            .collect();
        JsonObject::new().number("fraction", self.fraction).field("budgets", Json::Array(budgets)).finish()
    }
}

/// A kept period as rl_usage and rl_usage_all list it (the latter with its key first):
/// its bounds in epoch seconds (as rl_spend's resets_at), its amounts in units, exact.
fn usage_period(p: &UsagePeriod, with_key: bool) -> Json {
    let o = JsonObject::new();
    let o = if with_key { o.field("key", Json::Str(p.key.clone())) } else { o };
    o.field("period", Json::Str(p.period.clone()))
        .int("starts_at", p.starts_at / 1000)
        .int("ends_at", p.ends_at / 1000)
        .micros("used", p.used)
        .micros("quota", p.quota)
        .finish()
}

impl ToJson for Usage {
    /// rl_usage's answer: one key's kept periods.
    fn to_json(&self) -> Json {
        let periods = self.periods.iter().map(|p| usage_period(p, false)).collect();
        JsonObject::new()
            .field("key", Json::Str(self.key.clone()))
            .int("from_ms", self.from_ms)
            .int("to_ms", self.to_ms)
            .field("periods", Json::Array(periods))
            .finish()
    }
}

impl ToJson for UsagePage {
    /// rl_usage_all's answer: a page of every key's kept periods, and `next`, the cursor
    /// `[ends_at_ms, key, period]` of the last one when more follow (else null).
    fn to_json(&self) -> Json {
        let periods = self.periods.iter().map(|p| usage_period(p, true)).collect();
        let next = self.next.as_ref().map_or(Json::Null, |c| {
            Json::Array(vec![Json::Int(c.ends_at), Json::Str(c.key.clone()), Json::Str(c.period.clone())])
        });
        JsonObject::new()
            .int("from_ms", self.from_ms)
            .int("to_ms", self.to_ms)
            .field("periods", Json::Array(periods))
            .field("next", next)
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

impl ToJson for TakeAllAnswer {
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", self.admitted)
            .int("retry_after_ms", self.retry_after_ms)
            .int("retry_after_seconds", ceil_seconds(self.retry_after_ms))
            .field("items", Json::Array(self.items.iter().map(ToJson::to_json).collect()))
            .finish()
    }
}

impl ToJson for ChargeCheckDecision<'_> {
    /// A charge is always made: admitted, no wait; each item as rl_charge_all's.
    fn to_json(&self) -> Json {
        JsonObject::new()
            .bool("admitted", true)
            .int("retry_after_ms", 0)
            .int("retry_after_seconds", 0)
            .field("items", Json::Array(self.items.iter().map(ToJson::to_json).collect()))
            .field("policy", Json::Str(self.policy.to_owned()))
            .field("tier", optional_text(self.tier))
            .finish()
    }
}

impl ToJson for RefundAllDecision {
    fn to_json(&self) -> Json {
        JsonObject::new().field("items", Json::Array(self.items.iter().map(ToJson::to_json).collect())).finish()
    }
}

impl ToJson for LimitRefund {
    fn to_json(&self) -> Json {
        crate::each_kind!(LimitRefund, self, d => d.to_json())
    }
}

impl ToJson for LimitAnswer {
    fn to_json(&self) -> Json {
        crate::each_kind!(LimitAnswer, self, d => d.to_json())
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
