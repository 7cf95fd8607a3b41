//! envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over a store.

use crate::config::{Algorithm, Config, OnDatabaseError, Rule, Unit};
use crate::log;
use crate::metrics::{Hits, Metrics};
use crate::plan::{self, Descriptor, Item, Mode, PolicyCall, Slot, Sql};
use crate::store::{Failure, Store};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::{json, Value};
use std::sync::{Arc, RwLock};
use std::time::Instant;
use tonic::{Request, Response, Status};

pub struct Rls {
    pub config: Arc<RwLock<Arc<Config>>>,
    pub store: Store,
    pub metrics: Arc<Metrics>,
}

fn hits_of(request_hits: u32) -> u64 {
    u64::from(request_hits.max(1))
}

/// A policy's answer seen as one limit: the one that binds (the refusing one that waits
/// longest, else the one with the smallest share left), named after the rule or the policy.
fn policy_as_limit(
    rule: &Rule,
    call: &PolicyCall,
    answer: Option<&Value>,
) -> (Rule, Item, Mode, Option<Value>, Vec<Value>) {
    let items: Vec<Value> = answer.and_then(|a| a.get("items")).and_then(Value::as_array).cloned().unwrap_or_default();
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let binding = items
        .iter()
        .max_by(|a, b| {
            let key = |v: &Value| {
                let refused = if admitted(v) { 0.0 } else { 1.0 };
                let share = f(v, "remaining").unwrap_or(0.0) / f(v, "limit").unwrap_or(1.0).max(f64::MIN_POSITIVE);
                (refused, f(v, "retry_after_ms").unwrap_or(0.0), -share)
            };
            key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned();
    let limit = binding.as_ref().and_then(|b| f(b, "limit")).unwrap_or(0.0);
    let window = binding
        .as_ref()
        .and_then(|b| ["refill_seconds", "period_seconds", "window_seconds"].iter().find_map(|k| f(b, k)))
        .unwrap_or(0.0);
    let unit = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Year]
        .into_iter()
        .find(|u| u.seconds() == window)
        .or(if (2_419_200.0..=2_678_400.0).contains(&window) { Some(Unit::Month) } else { None });
    let mut view = rule.clone();
    view.name = Some(rule.name.clone().unwrap_or_else(|| call.policy.clone()));
    view.requests_per_unit = limit.clamp(0.0, f64::from(u32::MAX)) as u32;
    view.unit = unit.unwrap_or(Unit::Second);
    let item = Item {
        key: String::new(),
        algorithm: Algorithm::Bucket,
        unit: view.unit,
        requests_per_unit: view.requests_per_unit,
        cost: call.cost,
    };
    let mut flat = binding.unwrap_or_else(|| json!({}));
    if let (Some(o), Some(a)) = (flat.as_object_mut(), answer) {
        for k in ["admitted", "retry_after_ms"] {
            if let Some(v) = a.get(k) {
                o.insert(k.to_owned(), v.clone());
            }
        }
    }
    let mode = if call.refund { Mode::Refund } else { Mode::Take };
    (view, item, mode, answer.map(|_| flat), items)
}

fn admitted(answer: &Value) -> bool {
    answer.get("admitted").and_then(Value::as_bool) != Some(false)
}

impl Rls {
    async fn run(&self, sql: &Sql) -> Result<Value, Failure> {
        self.store.run(sql).await
    }

    /// Each plain limit's answer from the database (None: no limit, a zero limit, a
    /// window's refund); `refused_before`: a policy refused already, so nothing is taken.
    async fn limit_answers(&self, slots: &[Slot], mut refused_before: bool) -> Result<Vec<Option<Value>>, Failure> {
        let mut answers: Vec<Option<Value>> = vec![None; slots.len()];
        for (i, slot) in slots.iter().enumerate() {
            let Slot::Limited { rule, item, mode, .. } = slot else { continue };
            match mode {
                Mode::Zero => refused_before |= !rule.shadow,
                Mode::Check => {
                    let answer = self.run(&item.peek(1.0)).await?;
                    refused_before |= !rule.shadow && !admitted(&answer);
                    answers[i] = Some(answer);
                }
                Mode::Refund => {
                    if let Some(sql) = item.refund() {
                        answers[i] = Some(self.run(&sql).await?);
                    }
                }
                Mode::Take => {}
            }
        }
        let (items, index) = plan::merged_takes(slots, None);
        if items.is_empty() {
            return Ok(answers);
        }
        let item_answers: Vec<Value> = if refused_before {
            // refused already: nothing is taken; the others show their state
            let mut list = Vec::with_capacity(items.len());
            for item in &items {
                list.push(match self.run(&item.peek(0.0)).await {
                    Err(Failure::Refused(_)) => Value::Null,
                    other => other?,
                });
            }
            list
        } else {
            let refs: Vec<&Item> = items.iter().collect();
            let all = self.run(&Sql::take_all(&refs)).await?;
            let list: Vec<Value> = all.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            let enforced_refused = slots.iter().zip(&index).any(|(slot, at)| match (slot, at) {
                (Slot::Limited { rule, .. }, Some(at)) => !rule.shadow && !list.get(*at).is_some_and(admitted),
                _ => false,
            });
            if admitted(&all) || enforced_refused {
                list
            } else {
                // Only shadow rules refused: as if enforced they charge nothing, and the
                // enforced ones are taken on their own.
                let (enforced, e_index) = plan::merged_takes(slots, Some(false));
                if !enforced.is_empty() {
                    let refs: Vec<&Item> = enforced.iter().collect();
                    let again = self.run(&Sql::take_all(&refs)).await?;
                    let again: Vec<Value> = again.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                    for (i, at) in e_index.iter().enumerate() {
                        if let Some(at) = at {
                            answers[i] = again.get(*at).cloned();
                        }
                    }
                }
                for (i, (slot, at)) in slots.iter().zip(&index).enumerate() {
                    if let (Slot::Limited { rule, .. }, Some(at)) = (slot, at) {
                        if rule.shadow {
                            answers[i] = list.get(*at).cloned();
                        }
                    }
                }
                return Ok(answers);
            }
        };
        for (i, at) in index.iter().enumerate() {
            if let Some(at) = at {
                answers[i] = item_answers.get(*at).cloned().filter(|v| !v.is_null());
            }
        }
        Ok(answers)
    }

    fn respond(&self, domain: &str, slots: &[Slot], answers: &[Option<Value>], request_hits: u32) -> RateLimitResponse {
        let now_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let mut statuses = Vec::with_capacity(slots.len());
        let mut header_items = Vec::new();
        let mut retry = 0i64;
        for (slot, answer) in slots.iter().zip(answers) {
            let policy_view;
            let (rule, stat_key, item, mode, answer, extra_header_items) = match slot {
                Slot::Limited { rule, stat_key, item, mode } => (rule, stat_key, item, mode, answer, None),
                Slot::Policy { rule, stat_key, call } => {
                    policy_view = policy_as_limit(rule, call, answer.as_ref());
                    let (r, i, m, a, items) = &policy_view;
                    (r, stat_key, i, m, a, Some(items))
                }
                Slot::Unlimited { stat_key } => {
                    self.metrics.hits(
                        domain,
                        stat_key,
                        Hits { total: hits_of(request_hits), within: hits_of(request_hits), ..Default::default() },
                    );
                    statuses.push(DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..Default::default()
                    });
                    continue;
                }
                Slot::Free => {
                    statuses.push(DescriptorStatus { code: Code::Ok as i32, ..Default::default() });
                    continue;
                }
            };
            let ok = match mode {
                Mode::Zero => false,
                Mode::Refund => true,
                _ => answer.as_ref().is_none_or(admitted),
            };
            let hits = item.cost.max(0.0) as u64;
            let num = |k: &str| answer.as_ref().and_then(|a| a.get(k)).and_then(Value::as_f64);
            // a check asked about one more hit: what is left is what it would have taken too
            let asked = if *mode == Mode::Check && ok { item.cost } else { 0.0 };
            // a budget's refund answers what is used: what is left follows from the rule
            let left = num("remaining").or_else(|| num("used").map(|u| f64::from(item.requests_per_unit) - u));
            let remaining = (left.unwrap_or(0.0) + asked).max(0.0);
            if *mode != Mode::Refund {
                let near = ok && remaining < 0.2 * f64::from(item.requests_per_unit);
                self.metrics.hits(
                    domain,
                    stat_key,
                    Hits {
                        total: hits,
                        over: if ok { 0 } else { hits },
                        near: if near { hits } else { 0 },
                        within: if ok { hits } else { 0 },
                        shadow: if !ok && rule.shadow { hits } else { 0 },
                    },
                );
            }
            let reset = if !ok {
                match num("retry_after_ms") {
                    Some(ms) => (ms / 1000.0).ceil() as i64,
                    None => num("retry_after_seconds").map_or(rule.unit.seconds() as i64, |s| s as i64),
                }
            } else if let Some(s) = num("reset_after_seconds") {
                s.ceil() as i64
            } else if let Some(at) = num("resets_at") {
                (at as i64 - now_s).max(0)
            } else {
                rule.unit.seconds() as i64
            };
            let enforced_refusal = !ok && !rule.shadow;
            if enforced_refusal {
                retry = retry.max(reset);
            }
            if let (false, Some(a)) = (rule.shadow, answer) {
                if *mode != Mode::Refund {
                    match extra_header_items {
                        Some(items) => header_items.extend(items.iter().cloned()),
                        None => header_items.push(a.clone()),
                    }
                }
            }
            statuses.push(DescriptorStatus {
                code: if enforced_refusal { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: Some(RateLimit {
                    name: rule.name.clone().unwrap_or_default(),
                    requests_per_unit: rule.requests_per_unit,
                    unit: rule.unit.proto(),
                }),
                limit_remaining: remaining.min(f64::from(u32::MAX)).floor() as u32,
                duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration { seconds: reset, nanos: 0 }),
                ..Default::default()
            });
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        let mut response_headers_to_add = Vec::new();
        if !header_items.is_empty() {
            let result =
                json!({"policy": domain, "admitted": !over, "retry_after_seconds": retry, "items": header_items});
            if let Ok(headers) = ratelimit_core::headers::header_pairs(&result) {
                response_headers_to_add.extend(headers.into_iter().map(|(key, value)| HeaderValue {
                    key: key.to_owned(),
                    value,
                    ..Default::default()
                }));
            }
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        }
    }

    /// The policy checks first (rl_check is no rl_take_all item), each until one refuses;
    /// then the plain limits; and when the call is refused after all, the checks that took
    /// are given back (rl_refund_check), so that the descriptors stay all or nothing.
    async fn answers(&self, slots: &[Slot]) -> Result<Vec<Option<Value>>, Failure> {
        let mut refused = false;
        let mut taken: Vec<(usize, Value)> = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let Slot::Policy { rule, call, .. } = slot else { continue };
            if call.refund {
                taken.push((i, self.run(&call.give_back()).await?));
            } else if call.cost == 0.0 {
                return Err(Failure::Refused(format!(
                    "ShouldRateLimit: descriptor {}: a rule with a policy needs hits (hits_addend 0 checks plain limits only)",
                    i + 1
                )));
            } else if !refused {
                let answer = self.run(&call.check()).await?;
                refused |= !rule.shadow && !admitted(&answer);
                taken.push((i, answer));
            }
        }
        let mut answers = self.limit_answers(slots, refused).await?;
        for (i, answer) in taken {
            answers[i] = Some(answer);
        }
        let over = slots.iter().zip(&answers).any(|(slot, answer)| match slot {
            Slot::Limited { rule, mode: Mode::Zero, .. } => !rule.shadow,
            Slot::Limited { rule, mode, .. } if *mode != Mode::Refund => {
                !rule.shadow && answer.as_ref().is_some_and(|a| !admitted(a))
            }
            Slot::Policy { rule, call, .. } if !call.refund => {
                !rule.shadow && answer.as_ref().is_some_and(|a| !admitted(a))
            }
            _ => false,
        });
        if over {
            for (slot, answer) in slots.iter().zip(&answers) {
                if let (Slot::Policy { call, .. }, Some(a)) = (slot, answer) {
                    let charged = admitted(a) && a.get("would_refuse").and_then(Value::as_bool) != Some(true);
                    if !call.refund && charged {
                        self.run(&call.give_back()).await?;
                    }
                }
            }
        }
        Ok(answers)
    }

    fn everyone(slots: &[Slot], code: Code) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: code as i32,
            statuses: slots.iter().map(|_| DescriptorStatus { code: code as i32, ..Default::default() }).collect(),
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
        let config = self.config.read().unwrap_or_else(|p| p.into_inner()).clone();
        let descriptors: Vec<Descriptor<'_>> = request
            .descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect(),
                limit: d
                    .limit
                    .as_ref()
                    .and_then(|l| crate::config::Unit::from_proto(l.unit).map(|u| (l.requests_per_unit, u))),
                hits_addend: d.hits_addend.as_ref().map(|v| v.value),
                negative: d.is_negative_hits,
            })
            .collect();
        // An unknown domain has no limits: every descriptor is OK, as in the reference.
        let Some(domain) = config.domains.get(&request.domain) else {
            return Ok(Response::new(Rls::everyone(&vec![Slot::Free; descriptors.len()], Code::Ok)));
        };
        let slots = plan::slots(domain, &descriptors, request.hits_addend);
        let response = match self.answers(&slots).await {
            Ok(answers) => self.respond(&domain.name, &slots, &answers, request.hits_addend),
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
                    OnDatabaseError::Allow => Rls::everyone(&slots, Code::Ok),
                    OnDatabaseError::Deny => Rls::everyone(&slots, Code::OverLimit),
                }
            }
        };
        self.metrics.latency(started.elapsed());
        Ok(Response::new(response))
    }
}
