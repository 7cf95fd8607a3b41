//! Policies: named sets of limits stored as rows, applied to a subject by rl_check with a
//! tier's multiplier. Pure: a definition is parsed and validated here, and each policy
//! limit becomes an rl_take_all item under a key derived from the policy and the subject.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::args::{self, json_arg};
use crate::bucket::RefundDecision;
use crate::budget::BudgetRefund;
use crate::error::{Error, Result};
use crate::json::Json;
use crate::limit_json::{self, LimitShape};
use crate::messages as msg;
use crate::penalty::Block;
use crate::take_all::{Item, Limit, TakeAllAnswer};
use crate::units::{MAX_AMOUNT, MAX_TOKENS};
use crate::window::WindowDecision;

/// rl_check's decision: rl_take_all's over the policy's limits, and what the policy makes
/// of it.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckDecision<'a> {
    pub policy: &'a str,
    pub tier: Option<&'a str>,
    pub shadow: bool,
    /// The subject's block in force (then nothing was charged).
    pub blocked: Option<Block>,
    pub now_ms: i64,
    pub limits: TakeAllAnswer,
}

impl CheckDecision<'_> {
    /// Whether enforcement refuses (a shadow policy admits and reports this).
    pub fn would_refuse(&self) -> bool {
        !self.limits.admitted || self.blocked.is_some()
    }
}

/// rl_refund_check's decision: each limit's state after its refund, in the policy's order.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundCheckDecision<'a> {
    pub policy: &'a str,
    pub tier: Option<&'a str>,
    pub items: Vec<LimitRefund>,
}

/// rl_charge_check's decision: each limit's answer after its charge, in the policy's order.
#[derive(Debug, Clone, PartialEq)]
pub struct ChargeCheckDecision<'a> {
    pub policy: &'a str,
    pub tier: Option<&'a str>,
    pub items: Vec<crate::take_all::LimitAnswer>,
}

/// rl_refund_all's decision: each limit's state after its refund, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundAllDecision {
    pub items: Vec<LimitRefund>,
}

/// One limit's refund, answered as rl_refund, rl_refund_budget and rl_window_peek answer.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitRefund {
    Bucket(RefundDecision),
    Budget(BudgetRefund),
    Window(WindowDecision),
}

/// Most limits one policy holds.
pub const MAX_LIMITS: usize = 16;

use crate::units::POLICY_KEY_MARK;

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub limits: Vec<LimitShape>,
    /// Tier name to multiplier (finite, > 0).
    pub tiers: BTreeMap<String, f64>,
    /// Never refuses; reports what enforcement would do.
    pub shadow: bool,
}

fn invalid(message: String) -> Error {
    Error::invalid(message)
}

impl Policy {
    /// Parses and validates a whole definition; the error names the field.
    pub fn parse(text: &str) -> Result<Policy> {
        let value = args::json_value("definition", text)?;
        let o = value.as_object().ok_or_else(|| invalid(msg::DEFINITION_NOT_AN_OBJECT.template.into()))?;
        if let Some(extra) = o.keys().find(|k| !["limits", "tiers", "shadow"].contains(&k.as_str())) {
            return Err(invalid(msg::DEFINITION_UNKNOWN_FIELD.render(&[&format!("\"{extra}\"")])));
        }
        let list = o
            .get("limits")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(msg::DEFINITION_LIMITS_NOT_AN_ARRAY.template.into()))?;
        if list.is_empty() || list.len() > MAX_LIMITS {
            return Err(invalid(msg::ITEM_COUNT.render(&[&"definition.limits", &MAX_LIMITS, &list.len()])));
        }
        let limits = list
            .iter()
            .enumerate()
            .map(|(i, v)| limit(v).map_err(|e| invalid(format!("definition.limits item {}: {}", i + 1, e.message))))
            .collect::<Result<Vec<_>>>()?;
        let tiers = match o.get("tiers") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(t)) => t
                .iter()
                .map(|(name, m)| {
                    let at = format!("definition.tiers.{name}");
                    if name.is_empty() {
                        return Err(invalid(msg::TIER_NAME_EMPTY.template.into()));
                    }
                    args::positive_number(&at, &json_arg(m)).map(|m| (name.clone(), m))
                })
                .collect::<Result<BTreeMap<_, _>>>()?,
            Some(_) => return Err(invalid(msg::TIERS_NOT_AN_OBJECT.template.into())),
        };
        for (name, m) in &tiers {
            if let Some(i) = limits.iter().position(|l| !l.scales_by(*m)) {
                return Err(invalid(msg::MULTIPLIER_OUT_OF_RANGE.render(&[
                    name,
                    &crate::json::number_text(*m),
                    &(i + 1),
                    &(MAX_TOKENS as i64),
                    &(MAX_AMOUNT as i64),
                ])));
            }
        }
        let shadow = match o.get("shadow") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            // an array or object by its type: its text would differ between engines
            // (jsonb spaces it, SQLite keeps the caller's)
            Some(Value::Array(items)) => {
                return Err(invalid(msg::SHADOW.render(&[&format!("an array of {} values", items.len())])))
            }
            Some(Value::Object(_)) => return Err(invalid(msg::SHADOW.render(&[&"an object"]))),
            Some(other) => return Err(invalid(msg::SHADOW.render(&[other]))),
        };
        Ok(Policy { limits, tiers, shadow })
    }

    /// The definition as stored and returned: every field present, numbers as given.
    pub fn to_json(&self) -> Json {
        let limits = self.limits.iter().map(LimitShape::definition).collect();
        let tiers = self.tiers.iter().map(|(name, m)| (name.clone(), Json::Number(*m))).collect();
        Json::Object(vec![
            ("limits", Json::Array(limits)),
            ("tiers", Json::Map(tiers)),
            ("shadow", Json::Bool(self.shadow)),
        ])
    }

    /// The multiplier of `tier` (None: 1).
    pub fn multiplier(&self, tier: Option<&str>) -> Result<f64> {
        match tier {
            None => Ok(1.0),
            Some(t) => self.tiers.get(t).copied().ok_or_else(|| {
                let known: Vec<&str> = self.tiers.keys().map(String::as_str).collect();
                invalid(msg::UNKNOWN_TIER.render(&[&t, &known.join(", ")]))
            }),
        }
    }

    /// The key of limit `i` for `subject`: distinct for every policy, subject and limit
    /// (the policy name's length comes first, so where it ends is never in doubt), never
    /// a key a caller can pass, and short, since every row and index entry holds it:
    /// U+0001, then `<bytes of policy>:<policy>:<i>:<subject>`.
    pub fn key(policy: &str, subject: &str, i: usize) -> String {
        format!("{POLICY_KEY_MARK}{}:{policy}:{i}:{subject}", policy.len())
    }

    /// The keys of every limit of this policy (named `name`) for `subject`, in order.
    pub fn keys(&self, name: &str, subject: &str) -> Vec<String> {
        (0..self.limits.len()).map(|i| Policy::key(name, subject, i)).collect()
    }

    /// The policy's limits as rl_take_all items on `keys` (one per limit, from
    /// [`Policy::key`]), scaled by `multiplier`, each charged `cost` (millionths for
    /// budgets and windows).
    pub fn items<'k>(&self, keys: &'k [String], multiplier: f64, cost: f64) -> Vec<Limit<'k>> {
        self.limits
            .iter()
            .zip(keys)
            .enumerate()
            .map(|(position, (l, key))| {
                crate::each_kind!(LimitShape => Limit, l.scaled(multiplier), limits => Item::new(position, key, limits, cost))
            })
            .collect()
    }
}

/// One limit of a definition, by the parser rl_take_all's items share.
fn limit(v: &Value) -> Result<LimitShape> {
    limit_json::shape(limit_json::object(v, &limit_json::POLICY)?)
}

/// A revision for a newly stored definition: random, so that a policy dropped and set
/// again never comes back under a revision a connection still has cached.
pub fn new_revision() -> i64 {
    crate::units::random_u64() as i64
}
