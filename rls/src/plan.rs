//! From a ShouldRateLimit request to the limits it names, and from the database's answers
//! back to Envoy's response. No I/O here: `service` runs a plan against a store.
//!
//! Each request descriptor becomes a slot:
//! - no rule matches, or its rule is `unlimited`, or another matched rule `replaces` it:
//!   OK, no limit (as the reference answers);
//! - `requests_per_unit: 0`: refused without asking the database;
//! - `is_negative_hits`: a refund of its hits (buckets and budgets; a window keeps them);
//! - a descriptor `hits_addend` of 0: a check of one hit that charges nothing;
//! - otherwise its hits are taken, together with every other descriptor's, in one
//!   `rl_take_all`: all are charged or none. Two descriptors naming one counter add up.

use crate::config::{Algorithm, Domain, Rule, Unit};
use serde_json::{json, Value};

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

    /// The rl_take_all item.
    pub fn take_json(&self) -> Value {
        let n = f64::from(self.requests_per_unit);
        match self.algorithm {
            Algorithm::Bucket => json!({"key": self.key, "burst": n,
                "refill_per_minute": self.refill_per_minute(), "cost": self.cost}),
            Algorithm::Budget => json!({"key": self.key, "period": period(self.unit),
                "quota": n, "cost": self.cost}),
            Algorithm::Window => json!({"key": self.key, "limit": n,
                "window_seconds": self.unit.seconds(), "cost": self.cost}),
        }
    }

    /// The call that answers whether one more hit would be admitted, charging nothing.
    pub fn peek(&self, cost: f64) -> Sql {
        let n = f64::from(self.requests_per_unit);
        let key = Param::Text(self.key.clone());
        match self.algorithm {
            Algorithm::Bucket => Sql::call(
                "rl_peek",
                vec![key, Param::Real(n), Param::Real(self.refill_per_minute()), Param::Real(cost)],
            ),
            Algorithm::Budget => Sql::call(
                "rl_budget",
                vec![key, Param::Text(period(self.unit).to_owned()), Param::Real(n), Param::Real(cost)],
            ),
            Algorithm::Window => Sql::call(
                "rl_window_peek",
                vec![key, Param::Real(n), Param::Real(self.unit.seconds()), Param::Real(cost)],
            ),
        }
    }

    /// The call that gives hits back; a window has none (it cannot tell a hit from another).
    pub fn refund(&self) -> Option<Sql> {
        let n = f64::from(self.requests_per_unit);
        let key = Param::Text(self.key.clone());
        match self.algorithm {
            Algorithm::Bucket => Some(Sql::call(
                "rl_refund",
                vec![key, Param::Real(n), Param::Real(self.refill_per_minute()), Param::Real(self.cost)],
            )),
            Algorithm::Budget => Some(Sql::call(
                "rl_refund_budget",
                vec![key, Param::Text(period(self.unit).to_owned()), Param::Real(self.cost)],
            )),
            Algorithm::Window => None,
        }
    }
}

fn period(unit: Unit) -> &'static str {
    if unit == Unit::Month {
        "month"
    } else {
        "day"
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

    pub fn take_all(items: &[&Item]) -> Sql {
        let list: Vec<Value> = items.iter().map(|i| i.take_json()).collect();
        Sql::call("rl_take_all", vec![Param::Json(Value::Array(list).to_string())])
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

/// What one request descriptor asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Slot {
    /// OK with no limit: no rule, or replaced by another matched rule.
    Free,
    /// OK under an `unlimited` rule: limit_remaining says u32::MAX, as the reference's.
    Unlimited {
        stat_key: String,
    },
    Limited {
        rule: Rule,
        stat_key: String,
        item: Item,
        mode: Mode,
    },
    /// A rule naming a pg_ratelimit policy: rl_check, or rl_refund_check for negative hits.
    Policy {
        rule: Rule,
        stat_key: String,
        call: PolicyCall,
    },
}

impl Slot {
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            Slot::Limited { rule, .. } | Slot::Policy { rule, .. } => Some(rule),
            _ => None,
        }
    }
}

/// rl_check's arguments for one descriptor: the subject is the value of its last entry,
/// the tier the value of its `tier_key` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyCall {
    pub policy: String,
    pub subject: String,
    pub tier: Option<String>,
    pub cost: f64,
    pub refund: bool,
}

impl PolicyCall {
    fn sql(&self, function: &'static str) -> Sql {
        Sql::call(
            function,
            vec![
                Param::Text(self.policy.clone()),
                Param::Text(self.subject.clone()),
                Param::Real(self.cost),
                Param::MaybeText(self.tier.clone()),
            ],
        )
    }

    pub fn check(&self) -> Sql {
        self.sql("rl_check")
    }

    pub fn give_back(&self) -> Sql {
        self.sql("rl_refund_check")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Take,
    Check,
    Refund,
    /// requests_per_unit 0: always over the limit.
    Zero,
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

/// The state key of a request descriptor: the domain and every (key, value), as a JSON
/// array (unambiguous whatever the values hold), under the `envoy:` prefix.
pub fn state_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut parts = vec![Value::from(domain)];
    for (k, v) in entries {
        parts.push(Value::from(*k));
        parts.push(Value::from(*v));
    }
    format!("envoy:{}", Value::Array(parts))
}

/// The slots of a request, in order. `hits` is the request's hits_addend (0 means 1, as
/// the protocol has no way to say it is unset).
pub fn slots(domain: &Domain, descriptors: &[Descriptor<'_>], hits: u32) -> Vec<Slot> {
    let request_hits = f64::from(hits.max(1));
    let mut slots: Vec<Slot> = descriptors
        .iter()
        .map(|d| {
            let (rule, stat_key) = match d.limit {
                Some((n, unit)) => {
                    let rule = Rule {
                        name: None,
                        replaces: vec![],
                        unit,
                        requests_per_unit: n,
                        unlimited: false,
                        shadow: false,
                        detailed_metric: false,
                        algorithm: Algorithm::default_for(unit),
                        policy: None,
                    };
                    let stat: Vec<String> = d.entries.iter().map(|(k, v)| format!("{k}_{v}")).collect();
                    (rule, stat.join("."))
                }
                None => match domain.find(&d.entries) {
                    Some(m) => (m.rule.clone(), m.stat_key),
                    None => return Slot::Free,
                },
            };
            if rule.unlimited {
                return Slot::Unlimited { stat_key };
            }
            let cost = match d.hits_addend {
                Some(h) => h as f64,
                None => request_hits,
            };
            if let Some(policy) = &rule.policy {
                let tier = policy
                    .tier_key
                    .as_ref()
                    .and_then(|k| d.entries.iter().find(|(key, _)| key == k).map(|(_, v)| (*v).to_owned()));
                let call = PolicyCall {
                    policy: policy.name.clone(),
                    subject: d.entries.last().map_or("", |e| e.1).to_owned(),
                    tier,
                    cost,
                    refund: d.negative,
                };
                return Slot::Policy { rule, stat_key, call };
            }
            let mode = if rule.requests_per_unit == 0 {
                Mode::Zero
            } else if d.negative {
                Mode::Refund
            } else if cost == 0.0 {
                Mode::Check
            } else {
                Mode::Take
            };
            let item = Item {
                key: state_key(&domain.name, &d.entries),
                algorithm: rule.algorithm,
                unit: rule.unit,
                requests_per_unit: rule.requests_per_unit,
                cost: if mode == Mode::Check { 1.0 } else { cost },
            };
            Slot::Limited { rule, stat_key, item, mode }
        })
        .collect();
    // `replaces`: a matched rule removes the rules it names from this request.
    let replaced: Vec<String> = slots.iter().filter_map(Slot::rule).flat_map(|r| r.replaces.clone()).collect();
    for slot in &mut slots {
        if slot.rule().and_then(|r| r.name.as_ref()).is_some_and(|name| replaced.contains(name)) {
            *slot = Slot::Free;
        }
    }
    slots
}

/// The items of the slots taken together: one per counter (key and kind), costs added,
/// and for each slot the index of its item.
pub fn merged_takes(slots: &[Slot], shadow: Option<bool>) -> (Vec<Item>, Vec<Option<usize>>) {
    let mut items: Vec<Item> = Vec::new();
    let mut index = Vec::with_capacity(slots.len());
    for slot in slots {
        match slot {
            Slot::Limited { item, mode: Mode::Take, rule, .. } if shadow.is_none_or(|s| s == rule.shadow) => {
                let same = items.iter().position(|i| {
                    i.key == item.key
                        && i.algorithm == item.algorithm
                        && (i.algorithm != Algorithm::Budget || i.unit == item.unit)
                });
                match same {
                    Some(at) => {
                        items[at].cost += item.cost;
                        index.push(Some(at));
                    }
                    None => {
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
        assert!(matches!(&s[0], Slot::Limited { mode: Mode::Take, item, .. } if item.cost == 1.0
            && item.take_json() == json!({"key": "envoy:[\"api\",\"user\",\"ann\"]", "burst": 60.0, "refill_per_minute": 60.0, "cost": 1.0})));
        assert_eq!(s[1], Slot::Unlimited { stat_key: "path_/health".into() });
        assert_eq!(s[2], Slot::Free);
        // replaces: the free plan's rule removes per_user from the same request
        let s = slots(&domain, &[d(&[("user", "ann")]), d(&[("plan", "free")])], 3);
        assert_eq!(s[0], Slot::Free);
        assert!(matches!(&s[1], Slot::Limited { item, .. } if item.cost == 3.0
            && item.take_json()["period"] == "month"));
        let s = slots(&domain, &[d(&[("ip", "6.6.6.6")])], 1);
        assert!(matches!(&s[0], Slot::Limited { mode: Mode::Zero, .. }));
        let mut check = d(&[("user", "bob")]);
        check.hits_addend = Some(0);
        let mut refund = d(&[("user", "cy")]);
        refund.negative = true;
        refund.hits_addend = Some(4);
        let s = slots(&domain, &[check, refund], 9);
        assert!(matches!(&s[0], Slot::Limited { mode: Mode::Check, item, .. } if item.cost == 1.0));
        assert!(matches!(&s[1], Slot::Limited { mode: Mode::Refund, item, .. } if item.cost == 4.0));
        // an override needs no rule
        let mut o = d(&[("anything", "x")]);
        o.limit = Some((5, Unit::Hour));
        let s = slots(&domain, &[o], 1);
        assert!(matches!(&s[0], Slot::Limited { stat_key, item, .. } if stat_key == "anything_x"
            && item.take_json()["refill_per_minute"] == json!(5.0 / 60.0)));
    }

    #[test]
    fn one_counter_twice_adds_up() {
        let domain = parse_domain(DOC, "t").unwrap();
        let s = slots(&domain, &[d(&[("user", "ann")]), d(&[("user", "ann")]), d(&[("user", "bo")])], 2);
        let (items, index) = merged_takes(&s, None);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].cost, 4.0);
        assert_eq!(index, vec![Some(0), Some(0), Some(1)]);
    }

    #[test]
    fn sql_texts() {
        let sql = Sql::call("rl_peek", vec![Param::Text("k".into()), Param::Real(1.0), Param::Json("[]".into())]);
        assert_eq!(sql.postgres(), "SELECT rl_peek($1::text, $2::float8, $3::text::jsonb)::text");
        assert_eq!(sql.sqlite(), "SELECT rl_peek(?1, ?2, ?3)");
    }
}
