//! The benchmark harness's load for ratelimit-rls (bench/bench.py, RL_BENCH_ONLY=rls): the
//! same decisions asked two ways by one client program, so that the difference is what the
//! server adds.
//!
//! ```text
//! rls_load grpc ADDR DESCRIPTORS CLIENTS SECONDS     ShouldRateLimit to ratelimit-rls
//! rls_load sql  DBURL DESCRIPTORS CLIENTS SECONDS    the statement the server sends, over SQL
//! ```
//! The server counts as the reference does with one `rl_charge_all` a call (its items keyed
//! by domain, entries and unit); RLS_LOAD_FUNCTION=rl_take_all sends what it sends under
//! STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT instead.
//!
//! ```text
//! ```
//! DESCRIPTORS is 1 (a user's bucket) or 3 (the user's, the tenant's and a global bucket;
//! domain `bench`, bench/rls_bench.yaml). Each client is its own connection (one HTTP/2
//! connection or one PostgreSQL session) asking one call at a time, over 100,000 users.
//! Prints one JSON line: calls_per_s, p50_ms, p99_ms.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{rate_limit_descriptor::Entry, RateLimitDescriptor};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::time::{Duration, Instant};

const USERS: u64 = 100_000;

/// (key, value) entries of each descriptor for user `u`.
fn descriptors(n: usize, u: u64) -> Vec<Vec<(String, String)>> {
    let all = vec![
        vec![("user".to_owned(), format!("u{u}"))],
        vec![("tenant".to_owned(), format!("t{}", u % 100))],
        vec![("global".to_owned(), "all".to_owned())],
    ];
    all.into_iter().take(n).collect()
}

/// The rl_take_all items ratelimit-rls sends for them (bench/rls_bench.yaml: a bucket of a
/// billion an hour for each, so that every call is admitted).
fn items(n: usize, u: u64) -> String {
    let list: Vec<serde_json::Value> = descriptors(n, u)
        .iter()
        .map(|entries| {
            let mut key = vec![serde_json::Value::from("bench")];
            for (k, v) in entries {
                key.push(k.as_str().into());
                key.push(v.as_str().into());
            }
            key.push("hour".into());
            serde_json::json!({"key": format!("envoy:{}", serde_json::Value::Array(key)),
                "burst": 1e9, "refill_per_minute": 1e9 / 60.0, "cost": 1.0})
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn next(state: &mut u64) -> u64 {
    // xorshift64: a different user each call, the same sequence every run
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state % USERS + 1
}

async fn client(mode: String, target: String, n: usize, until: Instant, seed: u64) -> Vec<f64> {
    let mut latencies = Vec::new();
    let mut state = seed;
    // RLS_LOAD_DOMAIN=none: a domain the server does not know, answered without the database
    let domain = std::env::var("RLS_LOAD_DOMAIN").unwrap_or_else(|_| "bench".into());
    if mode == "grpc" {
        let mut c = RateLimitServiceClient::connect(format!("http://{target}")).await.expect("connect");
        while Instant::now() < until {
            let u = next(&mut state);
            let request = RateLimitRequest {
                domain: domain.clone(),
                descriptors: descriptors(n, u)
                    .into_iter()
                    .map(|entries| RateLimitDescriptor {
                        entries: entries.into_iter().map(|(key, value)| Entry { key, value }).collect(),
                        ..Default::default()
                    })
                    .collect(),
                hits_addend: 0,
            };
            let started = Instant::now();
            let answer = c.should_rate_limit(request).await.expect("ShouldRateLimit").into_inner();
            assert_eq!(answer.overall_code, 1, "every bench call is admitted");
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    } else {
        let (db, connection) = tokio_postgres::connect(&target, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        let function = std::env::var("RLS_LOAD_FUNCTION").unwrap_or_else(|_| "rl_charge_all".into());
        let statement = db.prepare(&format!("SELECT {function}($1::text::jsonb)::text")).await.expect("prepare");
        while Instant::now() < until {
            let json = items(n, next(&mut state));
            let started = Instant::now();
            let row = db.query_one(&statement, &[&json]).await.expect("rl_take_all");
            let text: String = row.get(0);
            assert!(text.starts_with("{\"admitted\":true") || text.contains("\"admitted\": true"), "{text}");
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    latencies
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, target, n, clients, seconds] = args.as_slice() else {
        eprintln!("usage: rls_load grpc|sql TARGET DESCRIPTORS CLIENTS SECONDS");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("DESCRIPTORS");
    let clients: u64 = clients.parse().expect("CLIENTS");
    let seconds: f64 = seconds.parse().expect("SECONDS");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let (calls, mut latencies, took) = runtime.block_on(async {
        let started = Instant::now();
        let until = started + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..clients)
            .map(|i| tokio::spawn(client(mode.clone(), target.clone(), n, until, 0x9E37_79B9_7F4A_7C15 ^ (i + 1))))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("client"));
        }
        (all.len(), all, started.elapsed().as_secs_f64())
    });
    latencies.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0.0);
    println!("{}", serde_json::json!({"calls_per_s": calls as f64 / took, "p50_ms": at(0.5), "p99_ms": at(0.99)}));
}
