//! rl_take_all: several buckets and budgets decided together, all or nothing.

use crate::args::{self, Arg, Clock};
use crate::bucket::ceil_seconds;
use crate::bucket::{self, BucketLimits, BucketState, TakeDecision};
use crate::budget::{self, BudgetState, Period, SpendDecision};
use crate::error::{Error, Result};
use crate::json::JsonObject;
use serde_json::{Map, Value};

/// Most items one call may hold.
pub const MAX_ITEMS: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct BucketItem<'a> {
    pub key: &'a str,
    pub limits: BucketLimits,
    pub cost: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetItem<'a> {
    pub key: &'a str,
    pub period: Period,
    pub quota: i64,
    pub cost: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item<'a> {
    Bucket(BucketItem<'a>),
    Budget(BudgetItem<'a>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ItemState {
    Bucket(Option<BucketState>),
    Budget(Option<BudgetState>),
}

/// A row to write for an item.
#[derive(Debug, Clone, PartialEq)]
pub enum NewRow {
    Bucket(BucketState),
    Budget(BudgetState),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TakeAllArgs<'a> {
    pub items: Vec<Item<'a>>,
    pub now_ms: i64,
    /// Item indexes in the order rows are read and locked: buckets, then budgets, each by
    /// key (and period), the same order for every call so that none waits in a cycle.
    pub lock_order: Vec<usize>,
}

impl<'a> TakeAllArgs<'a> {
    /// `(limits [, now_ms])`; `limits` is JSON text; items borrow their keys from `json`,
    /// which the caller parses first with [`parse_limits`].
    pub fn parse(function: &'static str, json: &'a Value, now_arg: Option<&Arg>, clock: &Clock) -> Result<Self> {
        let now_ms = args::now_ms(function, now_arg, clock)?;
        let list =
            json.as_array().ok_or_else(|| Error::invalid(function, "limits must be a JSON array of limit objects"))?;
        if list.is_empty() || list.len() > MAX_ITEMS {
            return Err(Error::invalid(
                function,
                format!("limits must hold 1 to {MAX_ITEMS} items, got {}", list.len()),
            ));
        }
        let items = list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                parse_item(function, v).map_err(|e| Error::invalid(function, format!("item {}: {}", i + 1, e.message)))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut lock_order: Vec<usize> = (0..items.len()).collect();
        lock_order.sort_by(|&x, &y| row_of(&items[x]).cmp(&row_of(&items[y])));
        if let Some(w) = lock_order.windows(2).find(|w| row_of(&items[w[0]]) == row_of(&items[w[1]])) {
            let (first, second) = (w[0].min(w[1]) + 1, w[0].max(w[1]) + 1);
            return Err(Error::invalid(
                function,
                format!("items {first} and {second} are the same limit (one key may appear once per kind and period)"),
            ));
        }
        Ok(TakeAllArgs { items, now_ms, lock_order })
    }
}

/// The JSON argument of rl_take_all as a value.
pub fn parse_limits(function: &'static str, arg: &Arg) -> Result<Value> {
    match *arg {
        Arg::Text(t) => {
            serde_json::from_str(t).map_err(|e| Error::invalid(function, format!("limits must be valid JSON: {e}")))
        }
        _ => Err(Error::invalid(function, format!("limits must be a JSON array, got {}", arg.describe()))),
    }
}

/// Which state row an item touches: buckets sort before budgets, then by key and period.
fn row_of<'a>(item: &Item<'a>) -> (u8, &'a str, Option<Period>) {
    match item {
        Item::Bucket(b) => (0, b.key, None),
        Item::Budget(b) => (1, b.key, Some(b.period)),
    }
}

fn json_arg(v: &Value) -> Arg<'_> {
    match v {
        Value::Null => Arg::Null,
        Value::String(s) => Arg::Text(s),
        Value::Number(n) => n.as_i64().map_or_else(|| Arg::Real(n.as_f64().unwrap_or(f64::NAN)), Arg::Integer),
        // booleans, arrays and objects are not numbers, keys or periods
        other => Arg::Blob(if other.is_boolean() { b"boolean" } else { b"json" }),
    }
}

fn parse_item<'a>(function: &'static str, v: &'a Value) -> Result<Item<'a>> {
    let o: &Map<String, Value> = v.as_object().ok_or_else(|| Error::invalid(function, "must be a JSON object"))?;
    let is_budget = o.contains_key("period");
    let allowed: &[&str] =
        if is_budget { &["key", "period", "quota", "cost"] } else { &["key", "burst", "refill_per_minute", "cost"] };
    if let Some(extra) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(Error::invalid(function, format!("unknown field \"{extra}\" (a bucket has key, burst, refill_per_minute, cost; a budget key, period, quota, cost)")));
    }
    let field = |name: &str| o.get(name).map_or(Arg::Null, json_arg);
    let key = args::key(function, &field("key"))?;
    let cost = o.get("cost").map(json_arg);
    if is_budget {
        Ok(Item::Budget(BudgetItem {
            key,
            period: args::period(function, &field("period"))?,
            quota: args::amount_micros(function, "quota", &field("quota"))?,
            cost: cost.map_or(Ok(args::MICROS_PER_UNIT), |c| args::amount_micros(function, "cost", &c))?,
        }))
    } else {
        Ok(Item::Bucket(BucketItem {
            key,
            limits: BucketLimits {
                burst: args::positive_number(function, "burst", &field("burst"))?,
                refill_per_minute: args::positive_number(function, "refill_per_minute", &field("refill_per_minute"))?,
            },
            cost: cost.map_or(Ok(1.0), |c| args::positive_number(function, "cost", &c))?,
        }))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ItemDecision {
    Bucket(TakeDecision),
    Budget(SpendDecision),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TakeAllDecision {
    pub admitted: bool,
    pub retry_after_ms: i64,
    /// Per item, in the order given: what that limit alone answers.
    pub items: Vec<ItemDecision>,
    /// Per item: the row to write, when the whole call is admitted.
    pub new_states: Vec<Option<NewRow>>,
}

impl TakeAllDecision {
    pub fn to_json(&self) -> String {
        let items: Vec<String> = self
            .items
            .iter()
            .map(|d| match d {
                ItemDecision::Bucket(t) => t.to_json(),
                ItemDecision::Budget(b) => b.to_json(),
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

/// Decides every item from its row. Admitted only if every item admits; otherwise nothing
/// is to be written and each item shows what its limit alone would answer.
pub fn decide(a: &TakeAllArgs, states: &[ItemState]) -> TakeAllDecision {
    let mut items = Vec::with_capacity(a.items.len());
    let mut new_states = Vec::with_capacity(a.items.len());
    let mut retry_after_ms = 0;
    for (item, state) in a.items.iter().zip(states) {
        match (item, state) {
            (Item::Bucket(b), ItemState::Bucket(s)) => {
                let d = bucket::take(s.as_ref(), &b.limits, b.cost, a.now_ms);
                retry_after_ms = retry_after_ms.max(d.retry_after_ms);
                new_states.push(d.new_state.map(NewRow::Bucket));
                items.push(ItemDecision::Bucket(d));
            }
            (Item::Budget(b), ItemState::Budget(s)) => {
                let d = budget::spend(s.as_ref(), b.period, b.quota, b.cost, a.now_ms);
                if !d.admitted {
                    retry_after_ms = retry_after_ms.max(d.resets_at_ms - a.now_ms);
                }
                new_states.push(d.new_state.map(NewRow::Budget));
                items.push(ItemDecision::Budget(d));
            }
            _ => unreachable!("states are read per item kind"),
        }
    }
    let admitted = new_states.iter().all(Option::is_some);
    TakeAllDecision { admitted, retry_after_ms: if admitted { 0 } else { retry_after_ms }, items, new_states }
}
