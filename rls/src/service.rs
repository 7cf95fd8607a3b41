//! envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over a store.
//!
//! One call: the request's descriptors become slots (`plan`); the counters they name are
//! counted in as few statements as the mode allows (one in the common case); each
//! descriptor's status, the statistics and the overall code follow the reference's
//! service (src/service/ratelimit.go) and limiter (src/limiter/base_limiter.go). No client
//! input makes a call fail: a value too long is keyed by its digest, too many descriptors
//! or hits past any counter's range are over the limit, and only the database's own
//! trouble is an error (answered per domain by `on_database_error`).

use crate::config::{Algorithm, Config, OnDatabaseError, Rule, Unit};
use crate::log;
use crate::metrics::{Hits, Metrics};
use crate::plan::{self, Count, Counted, Descriptor, Item, PolicyCall, Slot, Sql};
use crate::store::{Failure, Store};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value as PbValue};
use serde_json::{json, Value};
use std::sync::{Arc, RwLock};
use std::time::Instant;
use tonic::{Request, Response, Status};

/// The reference's global settings that change answers, read from the same environment
/// variables.
#[derive(Clone, Debug)]
pub struct Settings {
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a refused call counts nothing on the
    /// descriptors that were not over (those over count their hits, as the reference's do).
    pub stop_when_over: bool,
    /// SHADOW_MODE: every call is OK; what would have been refused is counted.
    pub shadow: bool,
    /// QUOTA_MODE: every descriptor is a quota (`quota_mode`).
    pub quota: bool,
    /// RESPONSE_DYNAMIC_METADATA.
    pub dynamic_metadata: bool,
    /// NEAR_LIMIT_RATIO (0.8).
    pub near_ratio: f32,
    /// LIMIT_RESPONSE_HEADERS_ENABLED with LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
    /// LIMIT_RESET_HEADER; otherwise the IETF draft's RateLimit and RateLimit-Policy.
    pub limit_headers: Option<[String; 3]>,
    /// RLS_MAX_DESCRIPTORS (64): a call with more is over the limit, unread.
    pub max_descriptors: usize,
}

/// Go's strconv.ParseBool, as the reference reads its settings.
pub fn env_bool(name: &str) -> Result<bool, String> {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("") => Ok(false),
        Ok("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Ok("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Ok(other) => Err(format!("{name} must be true or false, got {other:?}")),
    }
}

impl Settings {
    pub fn from_env() -> Result<Settings, String> {
        let text = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        let near_ratio: f32 = text("NEAR_LIMIT_RATIO", "0.8")
            .parse()
            .ok()
            .filter(|r: &f32| (0.0..=1.0).contains(r))
            .ok_or("NEAR_LIMIT_RATIO must be a number from 0 to 1")?;
        let max_descriptors: usize = text("RLS_MAX_DESCRIPTORS", "64")
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or("RLS_MAX_DESCRIPTORS must be a whole number from 1 to 64")?;
        Ok(Settings {
            stop_when_over: env_bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")?,
            shadow: env_bool("SHADOW_MODE")?,
            quota: env_bool("QUOTA_MODE")?,
            dynamic_metadata: env_bool("RESPONSE_DYNAMIC_METADATA")?,
            near_ratio,
            limit_headers: if env_bool("LIMIT_RESPONSE_HEADERS_ENABLED")? {
                Some([
                    text("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                    text("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                    text("LIMIT_RESET_HEADER", "RateLimit-Reset"),
                ])
            } else {
                None
            },
            max_descriptors,
        })
    }
}

pub struct Rls {
    pub config: Arc<RwLock<Arc<Config>>>,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    /// Charges of concurrent calls in one statement (counting as the reference does).
    pub batcher: crate::batch::Batcher,
}

/// What the database said about one slot, and the count it implies.
#[derive(Clone, Debug, Default)]
struct SlotAnswer {
    answer: Option<Value>,
    counted: Option<Counted>,
    /// Refused by the functions for a reason the client gave (a value out of range):
    /// over the limit, counted as such.
    failed: bool,
}

fn admitted(answer: &Value) -> bool {
    answer.get("admitted").and_then(Value::as_bool) != Some(false)
}

fn num(answer: &Value, key: &str) -> Option<f64> {
    answer.get(key).and_then(Value::as_f64)
}

fn items_of(answer: &Value) -> Vec<Value> {
    answer.get("items").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// A policy's answer seen as one limit: the one that binds (the refusing one that waits
/// longest, else the one with the smallest share left), named after the rule or the policy.
fn policy_as_limit(rule: &Rule, call: &PolicyCall, answer: Option<&Value>) -> (Rule, Option<Value>) {
    let items = answer.map(items_of).unwrap_or_default();
    let binding = items
        .iter()
        .max_by(|a, b| {
            let key = |v: &Value| {
                let refused = if admitted(v) && num(v, "remaining").unwrap_or(0.0) >= 0.0 { 0.0 } else { 1.0 };
                let share = num(v, "remaining").unwrap_or(0.0) / num(v, "limit").unwrap_or(1.0).max(f64::MIN_POSITIVE);
                (refused, num(v, "retry_after_ms").unwrap_or(0.0), -share)
            };
            key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned();
    let limit = binding.as_ref().and_then(|b| num(b, "limit")).unwrap_or(0.0);
    let window = binding
        .as_ref()
        .and_then(|b| ["refill_seconds", "period_seconds", "window_seconds"].iter().find_map(|k| num(b, k)))
        .unwrap_or(0.0);
    let unit = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Year]
        .into_iter()
        .find(|u| u.seconds() == window)
        .or(if (2_419_200.0..=2_678_400.0).contains(&window) { Some(Unit::Month) } else { None });
    let mut view = rule.clone();
    view.name = Some(rule.name.clone().unwrap_or_else(|| call.policy.clone()));
    view.requests_per_unit = limit.clamp(0.0, f64::from(u32::MAX)) as u32;
    view.unit = unit.unwrap_or(Unit::Second);
    let mut flat = binding.unwrap_or_else(|| json!({}));
    if let (Some(o), Some(a)) = (flat.as_object_mut(), answer) {
        for k in ["admitted", "retry_after_ms"] {
            if let Some(v) = a.get(k) {
                o.insert(k.to_owned(), v.clone());
            }
        }
    }
    (view, answer.map(|_| flat))
}

/// A JSON value as google.protobuf.Value.
fn pb_value(v: &Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue { values: a.iter().map(pb_value).collect() }),
        Value::Object(o) => Kind::StructValue(pb_struct(o)),
    };
    PbValue { kind: Some(kind) }
}

fn pb_struct(o: &serde_json::Map<String, Value>) -> Struct {
    Struct { fields: o.iter().map(|(k, v)| (k.clone(), pb_value(v))).collect() }
}

/// The reference's mergeMetadata: the first value of a field wins; maps merge.
fn merge_metadata(into: &mut serde_json::Map<String, Value>, from: &serde_json::Map<String, Value>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(Value::Object(a)), Value::Object(b)) => merge_metadata(a, b),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

fn unit_name(unit: i32) -> &'static str {
    match unit {
        1 => "SECOND",
        2 => "MINUTE",
        3 => "HOUR",
        4 => "DAY",
        5 => "MONTH",
        6 => "YEAR",
        7 => "WEEK",
        _ => "UNKNOWN",
    }
}

/// The response's dynamic metadata, as the reference's ratelimitToMetadata builds it.
fn metadata_of(request: &RateLimitRequest, passed: &[usize], slots: &[Slot]) -> Struct {
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|d| {
            let mut o = serde_json::Map::new();
            o.insert(
                "entries".into(),
                Value::Array(d.entries.iter().map(|e| Value::from(format!("{}={}", e.key, e.value))).collect()),
            );
            if let Some(l) = &d.limit {
                o.insert(
                    "limit".into(),
                    Value::from(format!("requests_per_unit:{} unit:{}", l.requests_per_unit, unit_name(l.unit))),
                );
            }
            if let Some(h) = &d.hits_addend {
                o.insert("hitsAddend".into(), json!(h.value as f64));
            }
            Value::Object(o)
        })
        .collect();
    let mut fields = serde_json::Map::new();
    fields.insert("domain".into(), Value::from(request.domain.clone()));
    fields.insert("descriptors".into(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), json!(f64::from(request.hits_addend)));
    }
    let mut merged = serde_json::Map::new();
    for &i in passed {
        if let Some(m) = slots.get(i).and_then(Slot::rule).and_then(|r| r.metadata.as_ref()) {
            merge_metadata(&mut merged, m);
        }
    }
    if !merged.is_empty() {
        fields.insert("metadata".into(), Value::Object(merged));
    }
    pb_struct(&fields)
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl Rls {
    async fn run(&self, sql: &Sql) -> Result<Value, Failure> {
        self.store.run(sql).await
    }

    /// The counters' answers: checks read, refunds give back, charges count. Each slot's
    /// answer and count.
    async fn count_limits(&self, slots: &[Slot], out: &mut [SlotAnswer]) -> Result<(), Failure> {
        // negative hits: given back, in one call
        let (items, index) = plan::counters(slots, Count::Refund);
        if !items.is_empty() {
            let pairs: Vec<(&Item, f64)> = items.iter().map(|i| (i, i.cost)).collect();
            let answers = items_of(&self.run(&Sql::all("rl_refund_all", &pairs)).await?);
            for (slot, at) in out.iter_mut().zip(&index) {
                if let Some(at) = at {
                    slot.answer = answers.get(*at).cloned();
                }
            }
        }
        // hits 0: what is left, as it is
        let (items, index) = plan::counters(slots, Count::Check);
        let mut checked = Vec::with_capacity(items.len());
        for item in &items {
            checked.push(self.run(&item.peek()).await?);
        }
        for (slot, at) in out.iter_mut().zip(&index) {
            if let Some(at) = at {
                let a = &checked[*at];
                let limit = f64::from(items[*at].requests_per_unit);
                // a read at cost 0 that is refused: the count is past the limit (a window
                // says what is left as 0 then)
                let used = plan::used_of(a, limit).unwrap_or(0.0);
                let used = if admitted(a) { used } else { used.max(limit + 1.0) };
                slot.counted = Some(Counted { before: used, after: used });
                slot.answer = Some(a.clone());
            }
        }
        // hits: charged
        let (items, index) = plan::counters(slots, Count::Charge);
        if items.is_empty() {
            return Ok(());
        }
        let answers = match self.charge(&items).await {
            Ok(answers) => answers,
            Err(Failure::Refused(message)) => {
                // a count past what a counter can hold: over the limit, nothing charged
                self.metrics.error("out_of_range");
                log::line("error", "hits past a counter's range are over the limit", &[("error", &message)]);
                for (slot, at) in out.iter_mut().zip(&index) {
                    if at.is_some() {
                        slot.failed = true;
                    }
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for ((slot, at), s) in out.iter_mut().zip(&index).zip(slots) {
            let (Some(at), Slot::Limited { hits, .. }) = (at, s) else { continue };
            let (answer, charged) = &answers[*at];
            let limit = f64::from(items[*at].requests_per_unit);
            let used = plan::used_of(answer, limit).unwrap_or(0.0);
            slot.counted = Some(if *charged {
                Counted { before: used - items[*at].cost, after: used - items[*at].cost + *hits as f64 }
            } else {
                // not charged (a refused call under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT):
                // the reference reads the count as if these hits had just been added
                Counted { before: used - *hits as f64, after: used }
            });
            slot.answer = Some(answer.clone());
        }
        Ok(())
    }

    /// Charges the counters as the mode says; for each, its answer and whether it was
    /// charged. A bucket or window more than one unit's limit in debt is given the excess
    /// back: a client that keeps calling past its limit waits at most about one unit, as
    /// the reference's counter lasts one unit (budgets end with their period anyway).
    async fn charge(&self, items: &[Item]) -> Result<Vec<(Value, bool)>, Failure> {
        let pairs: Vec<(&Item, f64)> = items.iter().map(|i| (i, i.cost)).collect();
        let answers: Vec<(Value, bool)> = if self.settings.stop_when_over {
            let taken = self.run(&Sql::all("rl_take_all", &pairs)).await?;
            let list = items_of(&taken);
            if admitted(&taken) {
                list.into_iter().map(|a| (a, true)).collect()
            } else {
                // only the counters over the limit count their hits, as the reference's do
                let over: Vec<usize> = (0..items.len()).filter(|i| !list.get(*i).is_some_and(admitted)).collect();
                let refused: Vec<(&Item, f64)> = over.iter().map(|i| (&items[*i], items[*i].cost)).collect();
                let charged = items_of(&self.run(&Sql::all("rl_charge_all", &refused)).await?);
                let mut out: Vec<(Value, bool)> = list.into_iter().map(|a| (a, false)).collect();
                for (i, a) in over.iter().zip(charged) {
                    out[*i] = (a, true);
                }
                out
            }
        } else {
            self.batcher.charge(items.to_vec(), self.store.deadline()).await?.into_iter().map(|a| (a, true)).collect()
        };
        let mut excess: Vec<(usize, f64)> = Vec::new();
        for (i, (answer, charged)) in answers.iter().enumerate() {
            let item = &items[i];
            // budgets and fixed windows end with their period, as the reference's counters do
            if !charged || matches!(item.algorithm, Algorithm::Budget | Algorithm::Fixed) {
                continue;
            }
            let limit = f64::from(item.requests_per_unit);
            let remaining = num(answer, "remaining").unwrap_or(0.0);
            if remaining < -limit {
                excess.push((i, (-limit - remaining).min(item.cost)));
            }
        }
        if !excess.is_empty() {
            let back: Vec<(&Item, f64)> = excess.iter().map(|(i, n)| (&items[*i], *n)).collect();
            // the answers stay the charge's: the count as the hits made it
            self.run(&Sql::all("rl_refund_all", &back)).await?;
        }
        Ok(answers)
    }

    /// The policy slots: negative hits give back, hits 0 read (rl_peek_check), hits charge
    /// (rl_check); a refused check is charged still (rl_charge_check, the reference counts
    /// refused hits) unless it is blocked or one of its limits is a unit in debt already.
    /// An unknown tier counts under the policy's base limits.
    async fn count_policies(&self, slots: &[Slot], out: &mut [SlotAnswer]) -> Result<(), Failure> {
        for (i, slot) in slots.iter().enumerate() {
            let Slot::Policy { call, .. } = slot else { continue };
            let answer = match self.policy_call(call).await {
                Ok(a) => a,
                Err(Failure::Refused(m)) if !(m.starts_with("42704") || m.contains("there is no policy named")) => {
                    self.metrics.error("out_of_range");
                    log::line("error", "a policy call past its range is over the limit", &[("error", &m)]);
                    out[i].failed = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            out[i].answer = Some(answer);
        }
        Ok(())
    }

    async fn policy_call(&self, call: &PolicyCall) -> Result<Value, Failure> {
        let first = self.policy_call_as_given(call).await;
        match (&first, &call.tier) {
            (Err(Failure::Refused(m)), Some(_)) if m.contains("is not one of this policy's tiers") => {
                let base = PolicyCall { tier: None, ..call.clone() };
                self.policy_call_as_given(&base).await
            }
            _ => first,
        }
    }

    async fn policy_call_as_given(&self, call: &PolicyCall) -> Result<Value, Failure> {
        if call.refund {
            return self.run(&call.give_back()).await;
        }
        if call.hits == 0 {
            return self.run(&call.peek()).await;
        }
        let answer = self.run(&call.check()).await?;
        let refused = answer.get("would_refuse").and_then(Value::as_bool) == Some(true);
        let blocked = answer.get("blocked").and_then(Value::as_bool) == Some(true);
        let deep = items_of(&answer).iter().any(|item| {
            item.get("used").is_none() && num(item, "remaining").unwrap_or(0.0) < -num(item, "limit").unwrap_or(0.0)
        });
        if refused && !blocked && !deep {
            let charged = self.run(&call.charge()).await?;
            let mut shown = answer.clone();
            if let Some(o) = shown.as_object_mut() {
                o.insert("items".into(), Value::Array(items_of(&charged)));
            }
            return Ok(shown);
        }
        Ok(answer)
    }

    fn status(&self, domain: &str, slot: &Slot, a: &SlotAnswer, header_items: &mut Vec<Value>) -> DescriptorStatus {
        let (rule, stat_key, hits, answer, counted, refund): (Rule, &str, u64, Option<Value>, Option<Counted>, bool) =
            match slot {
                Slot::Free => return DescriptorStatus { code: Code::Ok as i32, ..Default::default() },
                Slot::Unlimited { stat_key } => {
                    self.metrics.hits(domain, stat_key, Hits { total: 1, within: 1, ..Default::default() });
                    return DescriptorStatus { code: Code::Ok as i32, limit_remaining: u32::MAX, ..Default::default() };
                }
                Slot::Zero { rule, stat_key, hits } => {
                    (rule.clone(), stat_key, *hits, None, Some(Counted { before: 0.0, after: *hits as f64 }), false)
                }
                Slot::Limited { rule, stat_key, hits, count, .. } => {
                    (rule.clone(), stat_key, *hits, a.answer.clone(), a.counted, *count == Count::Refund)
                }
                Slot::Policy { rule, stat_key, call } => {
                    let (view, flat) = policy_as_limit(rule, call, a.answer.as_ref());
                    // over when the policy refused (what it would refuse in its own shadow
                    // mode is OK, as its answer says); counted as the binding limit shows it
                    let limit = f64::from(view.requests_per_unit);
                    let counted = flat.as_ref().map(|f| {
                        let used = plan::used_of(f, limit).unwrap_or(0.0).max(0.0);
                        if a.answer.as_ref().is_some_and(|ans| !admitted(ans)) {
                            Counted { before: limit, after: limit + (call.hits as f64).max(1.0) }
                        } else {
                            Counted { before: (used.min(limit) - call.hits as f64).max(0.0), after: used.min(limit) }
                        }
                    });
                    if let (false, Some(answer)) = (rule.shadow || call.refund, &a.answer) {
                        header_items.extend(items_of(answer));
                    }
                    (view, stat_key, call.hits, None, counted, call.refund)
                }
            };
        let limit = f64::from(rule.requests_per_unit);
        let counted =
            if a.failed { Some(Counted { before: limit, after: limit + (hits as f64).max(1.0) }) } else { counted };
        let over = !refund && counted.is_some_and(|c| c.after > limit);
        if !refund {
            if let Some(c) = counted {
                self.metrics.hits(
                    domain,
                    stat_key,
                    plan::stats_of(rule.requests_per_unit, c, hits, self.settings.near_ratio, rule.shadow),
                );
            }
        }
        let remaining = if over {
            0.0
        } else {
            match (counted, &answer) {
                (Some(c), _) => (limit - c.after).max(0.0),
                (None, Some(ans)) => (limit - plan::used_of(ans, limit).unwrap_or(limit)).max(0.0),
                (None, None) => 0.0,
            }
        };
        // over a bucket: until it holds one hit again (a refused hit was counted into it)
        let bucket_wait = match (slot, &answer) {
            (Slot::Limited { item, .. }, Some(ans)) if over && item.algorithm == Algorithm::Bucket && limit > 0.0 => {
                num(ans, "remaining")
                    .map(|r| ((1.0 - r.max(-limit)).max(0.0) * rule.unit.seconds() / limit).ceil() as i64)
            }
            _ => None,
        };
        let reset = bucket_wait
            .or_else(|| {
                answer.as_ref().and_then(|ans| {
                    let retry = num(ans, "retry_after_ms").filter(|ms| *ms > 0.0).map(|ms| (ms / 1000.0).ceil() as i64);
                    retry
                        .or_else(|| num(ans, "reset_after_seconds").map(|s| s.ceil() as i64))
                        .or_else(|| num(ans, "resets_at").map(|at| (at as i64 - now_seconds()).max(0)))
                })
            })
            .unwrap_or(rule.unit.seconds() as i64);
        if let (false, false, Some(ans)) = (rule.shadow, refund, &answer) {
            let mut shown = ans.clone();
            if let Some(o) = shown.as_object_mut() {
                if num(ans, "remaining").is_some_and(|r| r < 0.0) {
                    o.insert("remaining".into(), json!(0));
                    o.insert("admitted".into(), json!(!over));
                }
            }
            header_items.push(shown);
        }
        DescriptorStatus {
            code: if over && !rule.shadow { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name: rule.name.clone().unwrap_or_default(),
                requests_per_unit: rule.requests_per_unit,
                unit: rule.unit.proto(),
            }),
            limit_remaining: remaining.min(f64::from(u32::MAX)).floor() as u32,
            duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration { seconds: reset, nanos: 0 }),
            ..Default::default()
        }
    }

    fn respond(&self, request: &RateLimitRequest, slots: &[Slot], answers: &[SlotAnswer]) -> RateLimitResponse {
        let mut header_items = Vec::new();
        let statuses: Vec<DescriptorStatus> =
            slots.iter().zip(answers).map(|(s, a)| self.status(&request.domain, s, a, &mut header_items)).collect();
        // the overall code as the reference's service decides it
        let (mut failed, mut failed_quota, mut quotas) = (0, 0, 0);
        let mut passed = Vec::new();
        let mut minimum: Option<usize> = None;
        for (i, (slot, status)) in slots.iter().zip(&statuses).enumerate() {
            if self.settings.limit_headers.is_some()
                && status.current_limit.is_some()
                && minimum.is_none_or(|m| status.limit_remaining < statuses[m].limit_remaining)
            {
                minimum = Some(i);
            }
            if matches!(slot, Slot::Unlimited { .. }) {
                continue;
            }
            let quota = self.settings.quota || slot.rule().is_some_and(|r| r.quota);
            if status.code == Code::OverLimit as i32 {
                if quota {
                    failed_quota += 1;
                } else {
                    failed += 1;
                    minimum = Some(i);
                }
            } else {
                passed.push(i);
            }
            if quota {
                quotas += 1;
            }
        }
        let mut over = failed > 0 || (quotas > 0 && quotas == failed_quota);
        let mut response_headers_to_add = Vec::new();
        match (&self.settings.limit_headers, minimum) {
            (Some([limit, remaining, reset]), Some(m)) => {
                let s = &statuses[m];
                let unit = s.current_limit.as_ref().map_or(1, |l| l.unit);
                let divider = Unit::from_proto(unit).map_or(1, |u| u.seconds() as i64);
                let header =
                    |key: &str, value: String| HeaderValue { key: key.to_owned(), value, ..Default::default() };
                response_headers_to_add = vec![
                    header(limit, s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit).to_string()),
                    header(remaining, s.limit_remaining.to_string()),
                    header(reset, (divider - now_seconds() % divider).to_string()),
                ];
            }
            (None, _) if !header_items.is_empty() => {
                let retry = statuses
                    .iter()
                    .filter(|s| s.code == Code::OverLimit as i32)
                    .filter_map(|s| s.duration_until_reset.as_ref().map(|d| d.seconds))
                    .max()
                    .unwrap_or(0);
                let result = json!({"policy": request.domain, "admitted": !over, "retry_after_seconds": retry,
                    "items": header_items});
                if let Ok(headers) = ratelimit_core::headers::header_pairs(&result) {
                    response_headers_to_add.extend(headers.into_iter().map(|(key, value)| HeaderValue {
                        key: key.to_owned(),
                        value,
                        ..Default::default()
                    }));
                }
            }
            _ => {}
        }
        if over && self.settings.shadow {
            over = false;
            self.metrics.global_shadow();
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add,
            dynamic_metadata: if self.settings.dynamic_metadata {
                Some(metadata_of(request, &passed, slots))
            } else {
                None
            },
            ..Default::default()
        }
    }

    fn everyone(slots: usize, code: Code) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: code as i32,
            statuses: (0..slots).map(|_| DescriptorStatus { code: code as i32, ..Default::default() }).collect(),
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("ShouldRateLimit: domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument("ShouldRateLimit: descriptors must not be empty"));
        }
        if request.descriptors.len() > self.settings.max_descriptors {
            // more counters than one call counts: over the limit, unread (not an error,
            // which Envoy would let through)
            self.metrics.error("too_many_descriptors");
            log::line(
                "error",
                "a call with more descriptors than RLS_MAX_DESCRIPTORS is over the limit",
                &[("domain", &request.domain), ("descriptors", &request.descriptors.len().to_string())],
            );
            return Ok(Response::new(Rls::everyone(request.descriptors.len(), Code::OverLimit)));
        }
        let config = self.config.read().unwrap_or_else(|p| p.into_inner()).clone();
        // An unknown domain has no limits: every descriptor is OK, as in the reference.
        let Some(domain) = config.domains.get(&request.domain) else {
            return Ok(Response::new(Rls::everyone(request.descriptors.len(), Code::Ok)));
        };
        let descriptors: Vec<Descriptor<'_>> = request
            .descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect(),
                limit: d.limit.as_ref().and_then(|l| Unit::from_proto(l.unit).map(|u| (l.requests_per_unit, u))),
                hits_addend: d.hits_addend.as_ref().map(|v| v.value),
                negative: d.is_negative_hits,
            })
            .collect();
        let slots = plan::slots(domain, &descriptors, request.hits_addend);
        let mut answers = vec![SlotAnswer::default(); slots.len()];
        let counted = async {
            self.count_policies(&slots, &mut answers).await?;
            self.count_limits(&slots, &mut answers).await
        }
        .await;
        let response = match counted {
            Ok(()) => self.respond(&request, &slots, &answers),
            Err(Failure::Refused(message)) => {
                self.metrics.error("refused");
                log::line("error", "a call was refused", &[("domain", &domain.name), ("error", &message)]);
                return Err(Status::invalid_argument(message));
            }
            Err(Failure::Unreachable(message)) => {
                self.metrics.error("unreachable");
                log::line("error", "the database could not decide", &[("domain", &domain.name), ("error", &message)]);
                match domain.on_database_error {
                    OnDatabaseError::Error => return Err(Status::unavailable(format!("database: {message}"))),
                    OnDatabaseError::Allow => Rls::everyone(slots.len(), Code::Ok),
                    OnDatabaseError::Deny => Rls::everyone(slots.len(), Code::OverLimit),
                }
            }
        };
        self.metrics.latency(started.elapsed());
        Ok(Response::new(response))
    }
}
