//! From a ShouldRateLimit request to the limits it names, and from the database's answers
//! back to each descriptor's count. No I/O here: `service` runs a plan against a store.
//!
//! Each request descriptor becomes a slot:
//! - no rule matches, or another matched rule `replaces` it: OK, no limit;
//! - an `unlimited` rule: OK, limit_remaining u32::MAX (as the reference answers);
//! - `requests_per_unit: 0`: over the limit without asking the database;
//! - a rule naming a pg_ratelimit policy: rl_check and its kin;
//! - otherwise a counter: one per rule and request (the domain, every entry, the unit),
//!   as the reference keys its counters; descriptors naming one counter add up.
//!
//! A counter's hits are counted as the reference counts them (`Count`): a check (hits 0)
//! reads, negative hits give back, and hits are charged whatever the counter holds (the
//! call is over the limit when the count passes it), unless the server counts nothing of
//! a refused call (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).

use crate::config::{Algorithm, Domain, Rule, Unit};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// The longest state key sent as it is; a longer one (a JWT in a value) is keyed by its
/// SHA-256, as the web packages key long identifiers.
pub const MAX_PLAIN_KEY: usize = 256;

/// The most hits one descriptor is charged: enough for any real cost (a response's tokens),
/// far below what the functions refuse as out of range. Past it the count is still taken
/// as the hits say (the call is over the limit), and the counter charged this much.
pub const MAX_CHARGE: f64 = 1e12;

/// A pg_ratelimit limit with the state key that the request's entries give it.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub key: String,
    pub algorithm: Algorithm,
    pub unit: Unit,
    pub requests_per_unit: u32,
    pub cost: f64,
}

impl Item {
    /// A bucket's refill: the whole limit again over one unit.
    fn refill_per_minute(&self) -> f64 {
        f64::from(self.requests_per_unit) * 60.0 / self.unit.seconds()
    }

    /// The rl_take_all item, at `cost`.
    pub fn json(&self, cost: f64) -> Value {
        let n = f64::from(self.requests_per_unit);
        match self.algorithm {
            Algorithm::Bucket => json!({"key": self.key, "burst": n,
                "refill_per_minute": self.refill_per_minute(), "cost": cost}),
            Algorithm::Budget => json!({"key": self.key, "period": period(self.unit),
                "quota": n, "cost": cost}),
            Algorithm::Window => json!({"key": self.key, "limit": n,
                "window_seconds": self.unit.seconds(), "cost": cost}),
            Algorithm::Fixed => json!({"key": self.key, "limit": n,
                "fixed_window_seconds": self.unit.seconds(), "cost": cost}),
        }
    }

    /// The call that reads what is left, charging nothing (cost 0).
    pub fn peek(&self) -> Sql {
        let n = f64::from(self.requests_per_unit);
        let key = Param::Text(self.key.clone());
        match self.algorithm {
            Algorithm::Bucket => {
                Sql::call("rl_peek", vec![key, Param::Real(n), Param::Real(self.refill_per_minute()), Param::Real(0.0)])
            }
            Algorithm::Budget => Sql::call(
                "rl_budget",
                vec![key, Param::Text(period(self.unit).to_owned()), Param::Real(n), Param::Real(0.0)],
            ),
            Algorithm::Window | Algorithm::Fixed => Sql::call(
                if self.algorithm == Algorithm::Fixed { "rl_fixed_window_peek" } else { "rl_window_peek" },
                vec![key, Param::Real(n), Param::Real(self.unit.seconds()), Param::Real(0.0)],
            ),
        }
    }
}

/// The calendar period of a budget's unit (hour to year; config refuses the others).
fn period(unit: Unit) -> &'static str {
    match unit {
        Unit::Hour => "hour",
        Unit::Week => "week",
        Unit::Month => "month",
        Unit::Year => "year",
        _ => "day",
    }
}

/// A parameter of one SQL call.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    Text(String),
    Real(f64),
    /// A JSON document: text in SQLite, jsonb in PostgreSQL.
    Json(String),
    /// Text or NULL.
    MaybeText(Option<String>),
}

/// One `SELECT f(...)` whose single value is the function's JSON answer as text.
#[derive(Clone, Debug, PartialEq)]
pub struct Sql {
    pub function: &'static str,
    pub params: Vec<Param>,
}

impl Sql {
    pub fn call(function: &'static str, params: Vec<Param>) -> Sql {
        Sql { function, params }
    }

    /// rl_take_all, rl_charge_all or rl_refund_all over (item, cost) pairs.
    pub fn all(function: &'static str, items: &[(&Item, f64)]) -> Sql {
        let list: Vec<Value> = items.iter().map(|(i, cost)| i.json(*cost)).collect();
        Sql::call(function, vec![Param::Json(Value::Array(list).to_string())])
    }

    /// PostgreSQL's text, every parameter cast (the functions have defaults, not overloads).
    pub fn postgres(&self) -> String {
        let args: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Param::Text(_) | Param::MaybeText(_) => format!("${}::text", i + 1),
                Param::Real(_) => format!("${}::float8", i + 1),
                Param::Json(_) => format!("${}::text::jsonb", i + 1),
            })
            .collect();
        format!("SELECT {}({})::text", self.function, args.join(", "))
    }

    pub fn sqlite(&self) -> String {
        let args: Vec<String> = (1..=self.params.len()).map(|i| format!("?{i}")).collect();
        format!("SELECT {}({})", self.function, args.join(", "))
    }
}

/// What a counter's hits ask of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// hits_addend 0: what is left, charging nothing.
    Check,
    /// is_negative_hits: the hits given back.
    Refund,
    /// Hits charged.
    Charge,
}

/// What one request descriptor asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Slot {
    /// OK with no limit: no rule, or replaced by another matched rule.
    Free,
    /// OK under an `unlimited` rule: limit_remaining says u32::MAX, as the reference's.
    Unlimited {
        stat_key: String,
    },
    /// `requests_per_unit: 0`: over the limit with any hit.
    Zero {
        rule: Rule,
        stat_key: String,
        hits: u64,
    },
    Limited {
        rule: Rule,
        stat_key: String,
        item: Item,
        hits: u64,
        count: Count,
    },
    /// A rule naming a pg_ratelimit policy.
    Policy {
        rule: Rule,
        stat_key: String,
        call: PolicyCall,
    },
}

impl Slot {
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            Slot::Limited { rule, .. } | Slot::Policy { rule, .. } | Slot::Zero { rule, .. } => Some(rule),
            _ => None,
        }
    }
}

/// rl_check's arguments for one descriptor: the subject is the value of its last entry
/// (its SHA-256 past [`MAX_PLAIN_KEY`] bytes), the tier the value of its `tier_key` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyCall {
    pub policy: String,
    pub subject: String,
    pub tier: Option<String>,
    pub hits: u64,
    pub refund: bool,
}

impl PolicyCall {
    fn sql(&self, function: &'static str, cost: f64) -> Sql {
        Sql::call(
            function,
            vec![
                Param::Text(self.policy.clone()),
                Param::Text(self.subject.clone()),
                Param::Real(cost),
                Param::MaybeText(self.tier.clone()),
            ],
        )
    }

    pub fn cost(&self) -> f64 {
        (self.hits as f64).min(MAX_CHARGE)
    }

    pub fn check(&self) -> Sql {
        self.sql("rl_check", self.cost())
    }

    pub fn peek(&self) -> Sql {
        self.sql("rl_peek_check", 0.0)
    }

    pub fn charge(&self) -> Sql {
        self.sql("rl_charge_check", self.cost())
    }

    pub fn give_back(&self) -> Sql {
        self.sql("rl_refund_check", self.cost())
    }
}

/// One request descriptor as the protocol gives it.
pub struct Descriptor<'a> {
    pub entries: Vec<(&'a str, &'a str)>,
    /// The descriptor's limit override (requests_per_unit, unit).
    pub limit: Option<(u32, Unit)>,
    /// The descriptor's own hits_addend, when set.
    pub hits_addend: Option<u64>,
    pub negative: bool,
}

fn digest(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Text as the functions take it: as it is up to [`MAX_PLAIN_KEY`] bytes, else
/// `<prefix>sha256:<hex>`.
fn bounded(text: String, prefix: &str) -> String {
    if text.len() <= MAX_PLAIN_KEY {
        text
    } else {
        format!("{prefix}sha256:{}", digest(&text))
    }
}

/// The state key of one rule's counter for a request descriptor: the domain, every
/// (key, value) (a shared wildcard's value for the entries under share_threshold) and the
/// unit, as a JSON array (unambiguous whatever the values hold) under the `envoy:` prefix.
pub fn state_key(domain: &str, entries: &[(&str, &str)], shared: &[Option<String>], unit: Unit) -> String {
    let mut parts = Vec::with_capacity(entries.len() * 2 + 2);
    parts.push(Value::from(domain));
    for (i, (k, v)) in entries.iter().enumerate() {
        parts.push(Value::from(*k));
        parts.push(match shared.get(i) {
            Some(Some(p)) => Value::from(p.as_str()),
            _ => Value::from(*v),
        });
    }
    parts.push(Value::from(unit.name()));
    let text = Value::Array(parts).to_string();
    if text.len() + 6 <= MAX_PLAIN_KEY {
        format!("envoy:{text}")
    } else {
        format!("envoy:sha256:{}", digest(&text))
    }
}

/// The hits of each descriptor: its own hits_addend when set (0 only checks), else the
/// request's (0 counts as 1), as the reference's GetHitsAddends.
pub fn hits_of(d: &Descriptor<'_>, request_hits: u32) -> u64 {
    d.hits_addend.unwrap_or_else(|| u64::from(request_hits.max(1)))
}

/// The slots of a request, in order.
pub fn slots(domain: &Domain, descriptors: &[Descriptor<'_>], request_hits: u32) -> Vec<Slot> {
    let mut slots: Vec<Slot> = descriptors
        .iter()
        .map(|d| {
            let no_shares: Vec<Option<String>> = Vec::new();
            let (rule, stat_key, shared) = match d.limit {
                Some((n, unit)) => {
                    let mut key = domain.name.clone();
                    for (k, v) in &d.entries {
                        key.push('.');
                        key.push_str(k);
                        if !v.is_empty() {
                            key.push('_');
                            key.push_str(v);
                        }
                    }
                    (Rule::overriding(n, unit), crate::config::sanitize_stat(&key), no_shares)
                }
                None => match domain.find(&d.entries) {
                    Some(m) => (m.rule.clone(), m.stat_key, m.shared),
                    None => return Slot::Free,
                },
            };
            if rule.unlimited {
                return Slot::Unlimited { stat_key };
            }
            let hits = hits_of(d, request_hits);
            if let Some(policy) = &rule.policy {
                let tier = policy
                    .tier_key
                    .as_ref()
                    .and_then(|k| d.entries.iter().find(|(key, _)| key == k).map(|(_, v)| (*v).to_owned()));
                let call = PolicyCall {
                    policy: policy.name.clone(),
                    subject: bounded(d.entries.last().map_or("", |e| e.1).to_owned(), ""),
                    tier: tier.map(|t| bounded(t, "")),
                    hits,
                    refund: d.negative,
                };
                return Slot::Policy { rule, stat_key, call };
            }
            if rule.requests_per_unit == 0 {
                return Slot::Zero { rule, stat_key, hits };
            }
            let count = if d.negative {
                Count::Refund
            } else if hits == 0 {
                Count::Check
            } else {
                Count::Charge
            };
            let item = Item {
                key: state_key(&domain.name, &d.entries, &shared, rule.unit),
                algorithm: rule.algorithm,
                unit: rule.unit,
                requests_per_unit: rule.requests_per_unit,
                cost: (hits as f64).min(MAX_CHARGE),
            };
            Slot::Limited { rule, stat_key, item, hits, count }
        })
        .collect();
    // `replaces`: a matched rule removes the rules it names from this request.
    let replaced: std::collections::HashSet<&str> =
        slots.iter().filter_map(Slot::rule).flat_map(|r| r.replaces.iter().map(String::as_str)).collect();
    if !replaced.is_empty() {
        let gone: Vec<bool> = slots
            .iter()
            .map(|s| s.rule().and_then(|r| r.name.as_deref()).is_some_and(|name| replaced.contains(name)))
            .collect();
        for (slot, gone) in slots.iter_mut().zip(gone) {
            if gone {
                *slot = Slot::Free;
            }
        }
    }
    slots
}

/// The counters the slots charge (or check, or refund): one per state key and kind, the
/// costs of descriptors naming the same counter added up; and for each slot the index of
/// its counter. Linear in the number of descriptors.
pub fn counters(slots: &[Slot], count: Count) -> (Vec<Item>, Vec<Option<usize>>) {
    let mut items: Vec<Item> = Vec::new();
    let mut seen: HashMap<(String, Algorithm, Unit), usize> = HashMap::new();
    let mut index = Vec::with_capacity(slots.len());
    for slot in slots {
        match slot {
            Slot::Limited { item, count: c, .. } if *c == count => {
                let unit = if item.algorithm == Algorithm::Budget { item.unit } else { Unit::Second };
                match seen.get(&(item.key.clone(), item.algorithm, unit)) {
                    Some(&at) => {
                        items[at].cost = (items[at].cost + item.cost).min(MAX_CHARGE);
                        index.push(Some(at));
                    }
                    None => {
                        seen.insert((item.key.clone(), item.algorithm, unit), items.len());
                        items.push(item.clone());
                        index.push(Some(items.len() - 1));
                    }
                }
            }
            _ => index.push(None),
        }
    }
    (items, index)
}

/// A counter's count around one call, as the reference's limiter sees it: before and after
/// the hits (after > limit: over the limit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counted {
    pub before: f64,
    pub after: f64,
}

/// How much of a limit an answer says is used: a budget's `used`, else the limit less
/// `remaining`.
pub fn used_of(answer: &Value, limit: f64) -> Option<f64> {
    let f = |k: &str| answer.get(k).and_then(Value::as_f64);
    f("used").or_else(|| f("remaining").map(|r| limit - r))
}

/// The reference's per-rule statistics for a count (NEAR_LIMIT_RATIO `near`), in hits.
pub fn stats_of(limit: u32, c: Counted, hits: u64, near_ratio: f32, shadow: bool) -> crate::metrics::Hits {
    let limit_f = f64::from(limit);
    let near = (f64::from(limit as f32 * near_ratio)).floor();
    let hits_f = hits as f64;
    let (before, after) = (c.before.max(0.0), c.after.max(0.0));
    let mut out = crate::metrics::Hits { total: hits, ..Default::default() };
    if after > limit_f {
        let over = if before >= limit_f { hits_f } else { after - limit_f };
        out.over = over.round() as u64;
        if before < limit_f {
            out.near = (limit_f - near.max(before)).max(0.0).round() as u64;
        }
        if shadow {
            out.shadow = out.over;
        }
    } else {
        out.within = hits;
        if after > near {
            out.near = if before >= near { hits } else { (after - near).round() as u64 };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_domain;

    const DOC: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60, name: per_user}
  - key: plan
    value: free
    rate_limit: {unit: month, requests_per_unit: 1000, replaces: [{name: per_user}], name: free_plan}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: ip
    value: 6.6.6.6
    rate_limit: {unit: second, requests_per_unit: 0}
";

    fn d<'a>(entries: &[(&'a str, &'a str)]) -> Descriptor<'a> {
        Descriptor { entries: entries.to_vec(), limit: None, hits_addend: None, negative: false }
    }

    #[test]
    fn slots_table() {
        let domain = parse_domain(DOC, "t").unwrap();
        let s = slots(&domain, &[d(&[("user", "ann")]), d(&[("path", "/health")]), d(&[("nope", "x")])], 0);
        assert!(matches!(&s[0], Slot::Limited { count: Count::Charge, item, .. } if item.cost == 1.0
            && item.json(1.0) == json!({"key": "envoy:[\"api\",\"user\",\"ann\",\"minute\"]", "burst": 60.0, "refill_per_minute": 60.0, "cost": 1.0})));
        assert_eq!(s[1], Slot::Unlimited { stat_key: "api.path_/health".into() });
        assert_eq!(s[2], Slot::Free);
        let s = slots(&domain, &[d(&[("user", "ann")]), d(&[("plan", "free")])], 3);
        assert_eq!(s[0], Slot::Free);
        assert!(matches!(&s[1], Slot::Limited { item, .. } if item.cost == 3.0 && item.json(3.0)["period"] == "month"));
        let s = slots(&domain, &[d(&[("ip", "6.6.6.6")])], 1);
        assert!(matches!(&s[0], Slot::Zero { hits: 1, .. }));
        let mut check = d(&[("user", "bob")]);
        check.hits_addend = Some(0);
        let mut refund = d(&[("user", "cy")]);
        refund.negative = true;
        refund.hits_addend = Some(4);
        let s = slots(&domain, &[check, refund], 9);
        assert!(matches!(&s[0], Slot::Limited { count: Count::Check, hits: 0, .. }));
        assert!(matches!(&s[1], Slot::Limited { count: Count::Refund, item, .. } if item.cost == 4.0));
        let mut o = d(&[("anything", "x")]);
        o.limit = Some((5, Unit::Hour));
        let s = slots(&domain, &[o], 1);
        assert!(matches!(&s[0], Slot::Limited { stat_key, item, .. } if stat_key == "api.anything_x"
            && item.json(1.0)["refill_per_minute"] == json!(5.0 / 60.0)));
        // a huge hits_addend is charged at most MAX_CHARGE, and counted as it is
        let mut huge = d(&[("user", "dee")]);
        huge.hits_addend = Some(u64::MAX);
        let s = slots(&domain, &[huge], 1);
        assert!(matches!(&s[0], Slot::Limited { item, hits, .. } if item.cost == MAX_CHARGE && *hits == u64::MAX));
    }

    #[test]
    fn long_values_are_keyed_by_their_digest() {
        let long = "x".repeat(5000);
        let key = state_key("api", &[("user", &long)], &[], Unit::Minute);
        assert!(key.starts_with("envoy:sha256:") && key.len() == 13 + 64, "{key}");
        assert_ne!(key, state_key("api", &[("user", &long[1..])], &[], Unit::Minute));
        assert_eq!(state_key("a", &[("k", "v")], &[], Unit::Day), "envoy:[\"a\",\"k\",\"v\",\"day\"]");
    }

    #[test]
    fn one_counter_twice_adds_up_in_linear_time() {
        let domain = parse_domain(DOC, "t").unwrap();
        let s = slots(&domain, &[d(&[("user", "ann")]), d(&[("user", "ann")]), d(&[("user", "bo")])], 2);
        let (items, index) = counters(&s, Count::Charge);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].cost, 4.0);
        assert_eq!(index, vec![Some(0), Some(0), Some(1)]);
        let values: Vec<String> = (0..60_000).map(|i| format!("u{i}")).collect();
        let many: Vec<Descriptor> = values.iter().map(|v| d(&[("user", v.as_str())])).collect();
        let started = std::time::Instant::now();
        let (items, _) = counters(&slots(&domain, &many, 1), Count::Charge);
        assert_eq!(items.len(), 60_000);
        assert!(started.elapsed().as_secs_f64() < 5.0);
    }

    #[test]
    fn reference_stats_table() {
        // (limit, before, after, hits) -> (over, near, within): the reference's own cases
        let cases = [
            (15, 10.0, 11.0, 1, (0, 0, 1)),
            (15, 11.0, 13.0, 2, (0, 1, 2)),
            (15, 13.0, 16.0, 3, (1, 2, 0)),
            (8, 5.0, 7.0, 2, (0, 1, 2)),
            (20, 16.0, 19.0, 3, (0, 3, 3)),
            (20, 19.0, 22.0, 3, (2, 1, 0)),
            (20, 15.0, 22.0, 7, (2, 4, 0)),
            (10, 10.0, 13.0, 3, (3, 0, 0)),
            (5, 0.0, 6.0, 6, (1, 1, 0)),
        ];
        for (limit, before, after, hits, (over, near, within)) in cases {
            let h = stats_of(limit, Counted { before, after }, hits, 0.8, false);
            assert_eq!((h.over, h.near, h.within), (over, near, within), "{limit} {before} {after}");
        }
    }

    #[test]
    fn sql_texts() {
        let sql = Sql::call("rl_peek", vec![Param::Text("k".into()), Param::Real(1.0), Param::Json("[]".into())]);
        assert_eq!(sql.postgres(), "SELECT rl_peek($1::text, $2::float8, $3::text::jsonb)::text");
        assert_eq!(sql.sqlite(), "SELECT rl_peek(?1, ?2, ?3)");
    }
}
