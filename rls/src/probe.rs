//! `ratelimit-rls --probe`: one ShouldRateLimit call, as Envoy would send it, and its
//! answer printed as one JSON line: a gateway operator's first request, and a check that a
//! running server answers as its configuration says.
//!
//! ```text
//! ratelimit-rls --probe DOMAIN KEY=VALUE[,KEY=VALUE...]... [--grpc ADDR] [--hits N]
//! ```
//! Each positional argument after the domain is one descriptor, its entries in order
//! (`remote_address=10.0.0.1`, `plan=pro,user=alice`); `KEY=` is an entry with an empty
//! value. `--grpc` is the server's address (default 127.0.0.1:8081; a listener's
//! 0.0.0.0 is reached at 127.0.0.1). Exit status: 0 OK, 1 OVER_LIMIT, 2 an error (no
//! server there, a bad argument).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{rate_limit_descriptor::Entry, RateLimitDescriptor};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::{json, Value};

pub const USAGE: &str =
    "usage: ratelimit-rls --probe DOMAIN KEY=VALUE[,KEY=VALUE...]... [--grpc ADDR (127.0.0.1:8081)] [--hits N]";

/// What `--probe` was asked: the request, and where to send it.
#[derive(Debug, PartialEq)]
pub struct Probe {
    pub address: String,
    pub domain: String,
    pub descriptors: Vec<Vec<(String, String)>>,
    pub hits: u32,
}

/// The arguments after `--probe`, or what is wrong with them.
pub fn parse(args: &[String]) -> Result<Probe, String> {
    let mut address = "127.0.0.1:8081".to_owned();
    let mut hits = 0u32;
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--grpc" | "--hits" => {
                let value = args.get(i + 1).ok_or_else(|| format!("{} needs a value\n{USAGE}", args[i]))?;
                if args[i] == "--grpc" {
                    address = value.replace("0.0.0.0:", "127.0.0.1:");
                } else {
                    hits = value.parse().map_err(|_| format!("--hits must be a whole number from 0, got {value:?}"))?;
                }
                i += 2;
            }
            other if other.starts_with("--") => return Err(format!("unknown option {other}\n{USAGE}")),
            other => {
                positional.push(other.to_owned());
                i += 1;
            }
        }
    }
    let (domain, descriptors) = positional.split_first().ok_or_else(|| USAGE.to_owned())?;
    if descriptors.is_empty() {
        return Err(format!("--probe needs at least one descriptor after the domain\n{USAGE}"));
    }
    let descriptors = descriptors
        .iter()
        .map(|d| {
            d.split(',')
                .map(|entry| {
                    let (key, value) = entry.split_once('=').ok_or_else(|| {
                        format!("descriptor {d:?}: each entry is KEY=VALUE (KEY= for an empty value), got {entry:?}")
                    })?;
                    if key.is_empty() {
                        return Err(format!("descriptor {d:?}: an entry's key is empty"));
                    }
                    Ok((key.to_owned(), value.to_owned()))
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Probe { address, domain: domain.clone(), descriptors, hits })
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn status_json(s: &DescriptorStatus) -> Value {
    let mut out = json!({"code": code_name(s.code), "limit_remaining": s.limit_remaining});
    if let Some(limit) = &s.current_limit {
        out["current_limit"] = json!({
            "requests_per_unit": limit.requests_per_unit,
            "unit": limit.unit().as_str_name(),
            "name": limit.name,
        });
    }
    if let Some(reset) = &s.duration_until_reset {
        out["duration_until_reset_seconds"] = json!(reset.seconds);
    }
    out
}

fn headers_json(headers: &[HeaderValue]) -> Value {
    Value::Object(headers.iter().map(|h| (h.key.clone(), json!(h.value))).collect())
}

/// Sends the call; prints its answer; the exit status.
pub fn run(probe: Probe) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}", json!({"error": e.to_string()}));
            return 2;
        }
    };
    let answer = runtime.block_on(async {
        let endpoint = format!("http://{}", probe.address);
        let mut client = RateLimitServiceClient::connect(endpoint.clone())
            .await
            .map_err(|e| format!("no rate limit service at {}: {e}", probe.address))?;
        let request = RateLimitRequest {
            domain: probe.domain.clone(),
            descriptors: probe
                .descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(key, value)| Entry { key: key.clone(), value: value.clone() })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: probe.hits,
        };
        client
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|e| format!("{}: {}", probe.address, e.message()))
    });
    match answer {
        Ok(r) => {
            println!(
                "{}",
                json!({
                    "overall_code": code_name(r.overall_code),
                    "statuses": r.statuses.iter().map(status_json).collect::<Vec<_>>(),
                    "response_headers_to_add": headers_json(&r.response_headers_to_add),
                })
            );
            if r.overall_code == Code::OverLimit as i32 {
                1
            } else {
                0
            }
        }
        Err(e) => {
            eprintln!("{}", json!({"error": e}));
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn descriptors_are_entries_in_order() {
        let p = parse(&args("tiers plan=pro,user=alice remote_address=10.0.0.1 --hits 3 --grpc 0.0.0.0:9000")).unwrap();
        assert_eq!(p.domain, "tiers");
        assert_eq!(p.address, "127.0.0.1:9000");
        assert_eq!(p.hits, 3);
        assert_eq!(
            p.descriptors,
            vec![
                vec![("plan".into(), "pro".into()), ("user".into(), "alice".into())],
                vec![("remote_address".into(), "10.0.0.1".into())]
            ]
        );
        assert_eq!(parse(&args("d path=/a=b")).unwrap().descriptors, vec![vec![("path".into(), "/a=b".into())]]);
        assert_eq!(parse(&args("d key=")).unwrap().descriptors, vec![vec![("key".into(), "".into())]]);
    }

    #[test]
    fn what_is_wrong_is_said() {
        for (given, says) in [
            ("", "usage: ratelimit-rls --probe"),
            ("d", "at least one descriptor"),
            ("d key", "each entry is KEY=VALUE"),
            ("d =v", "an entry's key is empty"),
            ("d k=v --hits -1", "--hits must be a whole number"),
            ("d k=v --hits", "--hits needs a value"),
            ("d k=v --nope 1", "unknown option --nope"),
        ] {
            let e = parse(&args(given)).unwrap_err();
            assert!(e.contains(says), "{given:?}: {e}");
        }
    }
}
