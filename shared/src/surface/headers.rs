//! rl_headers: HTTP response headers from any result, without a database or a clock.
//!
//! `RateLimit-Policy` and `RateLimit` follow the IETF httpapi rate-limit headers draft
//! (structured-field lists: `"name";q=<quota>;w=<window seconds>` and
//! `"name";r=<remaining>;t=<seconds>`); `X-RateLimit-*` are the common de-facto headers;
//! `Retry-After` appears on a refusal that waiting can end only, in whole seconds rounded
//! up, so it is never 0 while the caller is limited (and absent for a cost above the limit).

use crate::error::{Error, Result};
use crate::json::Json;
use crate::units::MAX_WAIT_MS;
use serde_json::{Map, Value};

/// One limit as the headers see it.
struct Limit {
    name: String,
    limit: f64,
    remaining: f64,
    /// Seconds until the limit is whole again (buckets) or until a refused budget turns.
    reset_seconds: Option<i64>,
    /// What X-RateLimit-Reset shows: seconds until the limit is whole again, for every kind
    /// (a budget's `reset_after_seconds`, until its period turns; the `resets_at` epoch
    /// second only for a result of a release that did not carry it).
    x_reset: Option<i64>,
    retry_seconds: Option<i64>,
    /// The draft's quota unit (`qu`) when it is not requests.
    unit: Option<&'static str>,
    /// The draft's window (`w`), whole seconds: a bucket's full refill, a budget's period,
    /// a sliding window's length.
    window_seconds: Option<i64>,
    /// Refused for a cost above the limit, which no wait admits.
    exceeds_limit: bool,
}

/// What the headers read of a result: its fields by name, from JSON text parsed
/// (`rl_headers`, `ratelimit-rls`) or from the answer as the core built it (the compact
/// answers, which print no JSON at all).
trait Fields {
    fn num(&self, key: &str) -> Option<f64>;
    fn int(&self, key: &str) -> Option<i64>;
    fn flag(&self, key: &str) -> Option<bool>;
    fn has(&self, key: &str) -> bool;
    fn text(&self, key: &str) -> Option<&str>;
    /// A number as a count is checked for what the headers can print: any number, even one
    /// beyond a double (as infinity, which the check refuses).
    fn count(&self, key: &str) -> Option<f64>;
    /// The `items` array, each item the object it is (None for an item that is not one);
    /// None when there is no such array.
    fn items(&self) -> Option<Vec<Option<&Self>>>;
}

impl Fields for Map<String, Value> {
    fn num(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
    fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(Value::as_i64)
    }
    fn flag(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }
    fn has(&self, key: &str) -> bool {
        self.contains_key(key)
    }
    fn text(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    fn count(&self, key: &str) -> Option<f64> {
        match self.get(key) {
            Some(Value::Number(n)) => Some(crate::args::number_f64(n)),
            _ => None,
        }
    }
    fn items(&self) -> Option<Vec<Option<&Self>>> {
        self.get("items").and_then(Value::as_array).map(|a| a.iter().map(Value::as_object).collect())
    }
}

impl Json {
    fn field(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(fields) => fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

impl Fields for Json {
    fn num(&self, key: &str) -> Option<f64> {
        match self.field(key)? {
            Json::Int(n) => Some(*n as f64),
            Json::Number(v) if v.is_finite() => Some(*v),
            _ => None,
        }
    }
    fn int(&self, key: &str) -> Option<i64> {
        // as the same number printed and parsed again would read
        match self.field(key)? {
            Json::Int(n) => Some(*n),
            Json::Number(v) => match crate::json::number_form(*v) {
                crate::json::NumberForm::Int(n) => Some(n),
                _ => None,
            },
            _ => None,
        }
    }
    fn flag(&self, key: &str) -> Option<bool> {
        match self.field(key)? {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }
    fn has(&self, key: &str) -> bool {
        self.field(key).is_some()
    }
    fn text(&self, key: &str) -> Option<&str> {
        match self.field(key)? {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The core's own numbers are finite or left out of its answers.
    fn count(&self, key: &str) -> Option<f64> {
        self.num(key)
    }
    fn items(&self) -> Option<Vec<Option<&Self>>> {
        match self.field("items")? {
            Json::Array(a) => Some(a.iter().map(|i| matches!(i, Json::Object(_)).then_some(i)).collect()),
            _ => None,
        }
    }
}

fn limit_of<F: Fields>(name: String, o: &F) -> Option<Limit> {
    let limit = o.num("limit")?;
    let refused = o.flag("admitted") == Some(false);
    let exceeds_limit = o.flag("exceeds_limit") == Some(true);
    let retry_seconds = if refused && !exceeds_limit { o.int("retry_after_seconds") } else { None };
    let window_seconds = ["refill_seconds", "period_seconds", "window_seconds"]
        .iter()
        .find_map(|k| o.num(k))
        .filter(|w| w.is_finite())
        .map(|w| (w.ceil() as i64).max(1));
    if let Some(in_flight) = o.num("in_flight") {
        // A lease cap (rl_acquire): what is left is the leases not held. A slot comes back
        // when a lease is released or expires, which only a refusal's retry time bounds.
        return Some(Limit {
            name,
            limit,
            remaining: limit - in_flight,
            reset_seconds: retry_seconds,
            x_reset: None,
            retry_seconds,
            unit: Some("concurrent-requests"),
            window_seconds: None,
            exceeds_limit,
        });
    }
    let remaining = o.num("remaining")?;
    let (reset_seconds, x_reset) = match o.int("reset_after_seconds") {
        Some(reset) => (Some(reset), Some(reset)),
        None => (retry_seconds, Some(o.int("resets_at")?)),
    };
    Some(Limit {
        name,
        limit,
        remaining,
        reset_seconds,
        x_reset,
        retry_seconds,
        unit: None,
        window_seconds,
        exceeds_limit,
    })
}

/// Refuses a count no header can show exactly (the headers print whole numbers): beyond
/// 2^53 - 1, or beyond a double altogether.
fn exact_value(field: &str, value: f64) -> Result<()> {
    if value.is_nan() || value.abs() > MAX_WAIT_MS as f64 {
        let got = crate::args::Arg::Real(value).describe();
        return Err(Error::out_of_range(crate::messages::RESULT_TOO_LARGE.render(&[&field, &MAX_WAIT_MS, &got])));
    }
    Ok(())
}

const COUNTS: [&str; 3] = ["limit", "remaining", "in_flight"];

fn exact<F: Fields>(o: &F) -> Result<()> {
    for field in COUNTS {
        if let Some(value) = o.count(field) {
            exact_value(field, value)?;
        }
    }
    Ok(())
}

fn kind<F: Fields>(o: &F) -> &'static str {
    if o.has("resets_at") {
        "budget"
    } else if o.has("window_seconds") {
        "window"
    } else if o.has("in_flight") {
        "concurrency"
    } else {
        "bucket"
    }
}

/// The draft's name of each item of a call on several limits: for a policy's check, the
/// policy and the kind (`"login-bucket"`, and `"login-bucket-2"` for a kind that recurs);
/// for rl_take_all, the kind and the item's place (`"bucket-1"`).
fn item_names<F: Fields>(policy: Option<&str>, items: &[Option<&F>]) -> Vec<String> {
    let kinds: Vec<&str> = items.iter().map(|i| i.map_or("bucket", kind)).collect();
    let Some(policy) = policy else {
        return kinds.iter().enumerate().map(|(i, k)| format!("{k}-{}", i + 1)).collect();
    };
    let policy = sf_text(policy);
    kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let seen = kinds[..i].iter().filter(|other| *other == k).count();
            if seen == 0 && kinds.iter().filter(|other| *other == k).count() == 1 {
                format!("{policy}-{k}")
            } else {
                format!("{policy}-{k}-{}", seen + 1)
            }
        })
        .collect()
}

/// Text as a structured field's string holds it: printable ASCII, `"` and `\` escaped,
/// anything else `_`.
fn sf_text(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' => "\\\"".to_owned(),
            '\\' => "\\\\".to_owned(),
            ' '..='~' => c.to_string(),
            _ => "_".to_owned(),
        })
        .collect()
}

fn whole(v: f64) -> i64 {
    v.max(0.0).floor() as i64
}

fn shown(v: f64) -> String {
    crate::json::number_text(v.max(0.0))
}

/// Retry-After's value: never 0 while the caller is limited.
fn shown_retry(retry: Option<i64>) -> Option<i64> {
    retry.map(|r| r.max(1))
}

fn not_a_result() -> Error {
    Error::invalid(crate::messages::NOT_A_RESULT.template)
}

/// `rl_headers(result)`: a JSON object of header names to values, as text.
pub fn headers(result: &str) -> Result<Json> {
    crate::args::json_size("result", result.len())?;
    let value: Value = serde_json::from_str(result).map_err(|_| not_a_result())?;
    let pairs = header_pairs(&value)?;
    Ok(Json::Object(pairs.into_iter().map(|(name, value)| (name, Json::Str(value))).collect()))
}

/// The limits a result holds, the Retry-After it calls for, and the limit that binds (the
/// one the X- headers and the compact answer describe).
struct Shown {
    limits: Vec<Limit>,
    retry: Option<i64>,
    binding: usize,
}

fn shown_limits<F: Fields>(o: &F) -> Result<Shown> {
    let bad = not_a_result;
    let (limits, retry) = match o.items() {
        Some(items) => {
            let names = item_names(o.text("policy"), &items);
            let limits = items
                .iter()
                .zip(names)
                .map(|(item, name)| item.and_then(|io| limit_of(name, io)))
                .collect::<Option<Vec<Limit>>>()
                .filter(|l| !l.is_empty())
                .ok_or_else(bad)?;
            // A call that one limit can never admit gets no Retry-After: waiting does not help.
            let refused = o.flag("admitted") == Some(false);
            let never = limits.iter().any(|l| l.exceeds_limit);
            (limits, if refused && !never { o.int("retry_after_seconds") } else { None })
        }
        None => {
            let single = limit_of(kind(o).to_owned(), o).ok_or_else(bad)?;
            let retry = single.retry_seconds;
            (vec![single], retry)
        }
    };
    // The X- headers describe the limit that binds: the refusing one that waits longest,
    // else the one with the smallest share left.
    let binding = limits
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| {
            let key = |l: &Limit| (l.retry_seconds.unwrap_or(-1), -(l.remaining / l.limit));
            key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
        })
        .map_or(0, |(i, _)| i);
    Ok(Shown { limits, retry, binding })
}

/// The compact answer of `rl_take_compact`, `rl_check_compact` and `rl_take_all_compact`:
/// five numbers separated by single spaces, `admitted limit remaining reset retry_after`:
/// admitted is 1 or 0; the others are the values `rl_headers` gives the same answer's
/// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (0 for a lease cap, which
/// states none) and Retry-After (0 when there is none: admitted, or refused for a cost no
/// wait admits).
pub fn compact(answer: &Json) -> Result<String> {
    exact(answer)?;
    if let Some(items) = answer.items() {
        for item in items.into_iter().flatten() {
            exact(item)?;
        }
    }
    let limits = shown_limits(answer)?;
    let binding = &limits.limits[limits.binding];
    let admitted = answer.flag("admitted") == Some(true);
    let mut out = String::with_capacity(32);
    out.push(if admitted { '1' } else { '0' });
    for field in [shown(binding.limit), shown(binding.remaining)] {
        out.push(' ');
        out.push_str(&field);
    }
    for field in [binding.x_reset.unwrap_or(0), shown_retry(limits.retry).unwrap_or(0)] {
        out.push(' ');
        out.push_str(itoa::Buffer::new().format(field));
    }
    Ok(out)
}

/// The headers of a result already parsed, as (name, value) pairs in rl_headers' order:
/// for a server that holds the answer as a value (ratelimit-rls) and sends headers, not text.
pub fn header_pairs(value: &Value) -> Result<Vec<(&'static str, String)>> {
    let o = value.as_object().ok_or_else(not_a_result)?;
    exact(o)?;
    if let Some(items) = o.get("items").and_then(Value::as_array) {
        for item in items.iter().filter_map(Value::as_object) {
            exact(item)?;
        }
    }
    let Shown { limits, retry, binding } = shown_limits(o)?;
    let binding = &limits[binding];
    let policy: Vec<String> = limits
        .iter()
        .map(|l| {
            let mut item = format!("\"{}\";q={}", l.name, whole(l.limit));
            if let Some(unit) = l.unit {
                item += &format!(";qu=\"{unit}\"");
            }
            if let Some(w) = l.window_seconds {
                item += &format!(";w={w}");
            }
            item
        })
        .collect();
    let state: Vec<String> = limits
        .iter()
        .map(|l| match l.reset_seconds {
            Some(t) => format!("\"{}\";r={};t={}", l.name, whole(l.remaining), t),
            None => format!("\"{}\";r={}", l.name, whole(l.remaining)),
        })
        .collect();
    let mut out = vec![
        ("RateLimit-Policy", policy.join(", ")),
        ("RateLimit", state.join(", ")),
        ("X-RateLimit-Limit", shown(binding.limit)),
        ("X-RateLimit-Remaining", shown(binding.remaining)),
    ];
    if let Some(reset) = binding.x_reset {
        out.push(("X-RateLimit-Reset", reset.to_string()));
    }
    if let Some(retry) = shown_retry(retry) {
        out.push(("Retry-After", retry.to_string()));
    }
    Ok(out)
}
