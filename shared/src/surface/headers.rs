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

fn num(o: &Map<String, Value>, key: &str) -> Option<f64> {
    o.get(key).and_then(Value::as_f64)
}

fn int(o: &Map<String, Value>, key: &str) -> Option<i64> {
    o.get(key).and_then(Value::as_i64)
}

fn limit_of(name: String, o: &Map<String, Value>) -> Option<Limit> {
    let limit = num(o, "limit")?;
    let refused = o.get("admitted").and_then(Value::as_bool) == Some(false);
    let exceeds_limit = o.get("exceeds_limit").and_then(Value::as_bool) == Some(true);
    let retry_seconds = if refused && !exceeds_limit { int(o, "retry_after_seconds") } else { None };
    let window_seconds = ["refill_seconds", "period_seconds", "window_seconds"]
        .iter()
        .find_map(|k| num(o, k))
        .filter(|w| w.is_finite())
        .map(|w| (w.ceil() as i64).max(1));
    if let Some(in_flight) = num(o, "in_flight") {
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
    let remaining = num(o, "remaining")?;
    let (reset_seconds, x_reset) = match int(o, "reset_after_seconds") {
        Some(reset) => (Some(reset), Some(reset)),
        None => (retry_seconds, Some(int(o, "resets_at")?)),
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
fn exact(o: &Map<String, Value>) -> Result<()> {
    for field in ["limit", "remaining", "in_flight"] {
        if let Some(Value::Number(n)) = o.get(field) {
            let value = crate::args::number_f64(n);
            if value.is_nan() || value.abs() > MAX_WAIT_MS as f64 {
                let got = crate::args::Arg::Real(value).describe();
                return Err(Error::out_of_range(crate::messages::RESULT_TOO_LARGE.render(&[
                    &field,
                    &MAX_WAIT_MS,
                    &got,
                ])));
            }
        }
    }
    Ok(())
}

fn kind(o: &Map<String, Value>) -> &'static str {
    if o.contains_key("resets_at") {
        "budget"
    } else if o.contains_key("window_seconds") {
        "window"
    } else if o.contains_key("in_flight") {
        "concurrency"
    } else {
        "bucket"
    }
}

/// The draft's name of each item of a call on several limits: for a policy's check, the
/// policy and the kind (`"login-bucket"`, and `"login-bucket-2"` for a kind that recurs);
/// for rl_take_all, the kind and the item's place (`"bucket-1"`).
fn item_names(policy: Option<&str>, items: &[Value]) -> Vec<String> {
    let kinds: Vec<&str> = items.iter().map(|i| i.as_object().map_or("bucket", kind)).collect();
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

/// The headers of a result already parsed, as (name, value) pairs in rl_headers' order:
/// for a server that holds the answer as a value (ratelimit-rls) and sends headers, not text.
pub fn header_pairs(value: &Value) -> Result<Vec<(&'static str, String)>> {
    let bad = not_a_result;
    let o = value.as_object().ok_or_else(bad)?;
    let items = o.get("items").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    for object in std::iter::once(o).chain(items.iter().filter_map(Value::as_object)) {
        exact(object)?;
    }
    let (limits, retry) = match o.get("items").and_then(Value::as_array) {
        Some(items) => {
            let names = item_names(o.get("policy").and_then(Value::as_str), items);
            let limits = items
                .iter()
                .zip(names)
                .map(|(item, name)| item.as_object().and_then(|io| limit_of(name, io)))
                .collect::<Option<Vec<Limit>>>()
                .filter(|l| !l.is_empty())
                .ok_or_else(bad)?;
            // A call that one limit can never admit gets no Retry-After: waiting does not help.
            let refused = o.get("admitted").and_then(Value::as_bool) == Some(false);
            let never = limits.iter().any(|l| l.exceeds_limit);
            (limits, if refused && !never { int(o, "retry_after_seconds") } else { None })
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
        .max_by(|a, b| {
            let key = |l: &Limit| (l.retry_seconds.unwrap_or(-1), -(l.remaining / l.limit));
            key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
        })
        .expect("at least one limit");
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
    if let Some(retry) = retry {
        out.push(("Retry-After", retry.max(1).to_string()));
    }
    Ok(out)
}
