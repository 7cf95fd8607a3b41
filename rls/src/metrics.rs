//! Prometheus metrics under the reference server's names (its statsd names as its
//! Prometheus mapping spells them), served as text on `/metrics` beside `/healthcheck`.
//!
//! - `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}{domain,key}`:
//!   hits per matched rule, `key` as the reference builds it (`key_value.key`, with every
//!   value under `detailed_metric`); near means admitted with less than 20% left.
//! - `ratelimit_service_should_rate_limit_seconds`: a histogram of each call's time.
//! - `ratelimit_service_errors_total{kind}`: database unreachable, call refused.
//! - `ratelimit_service_config_loads_total{result}`, and the reference's
//!   `ratelimit_service_config_load_success` and `ratelimit_service_config_load_error`.
//! - `ratelimit_service_global_shadow_mode`: calls answered OK under SHADOW_MODE that
//!   would have been refused.
//! - `ratelimit_service_charge_statements_total` and `ratelimit_service_charged_calls_total`:
//!   how many calls the batched charges carried (`batch`), per statement.
//!
//! The per-rule series are bounded: past RLS_MAX_METRIC_KEYS keys (default
//! [`MAX_SERIES`]; detailed_metric and value_to_metric put request values in keys), new
//! keys count under `key="_other"`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Default, Clone, Copy)]
pub struct Hits {
    pub total: u64,
    pub over: u64,
    pub near: u64,
    pub within: u64,
    pub shadow: u64,
}

/// One of the per-rule counters.
type Field = fn(&Hits) -> u64;

/// The most per-rule series kept; later keys count under `_other`.
pub const MAX_SERIES: usize = 10_000;

const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0];

#[derive(Default)]
struct Inner {
    hits: BTreeMap<(String, String), Hits>,
    latency: [u64; BUCKETS.len()],
    latency_count: u64,
    latency_sum: f64,
    errors: BTreeMap<&'static str, u64>,
    loads: BTreeMap<&'static str, u64>,
    global_shadow: u64,
    charge_statements: u64,
    charged_calls: u64,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    /// What `/healthcheck` answers: serving (200) once the database answers, not while it
    /// cannot be reached or the server drains (503).
    pub serving: std::sync::atomic::AtomicBool,
    /// The most per-rule series (0: [`MAX_SERIES`]).
    pub max_series: usize,
}

impl Metrics {
    pub fn with_max_series(max_series: usize) -> Metrics {
        Metrics { max_series, ..Default::default() }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Counts a rule's hits under its stat key (`domain.key_value.key`, the domain a
    /// label of its own).
    pub fn hits(&self, domain: &str, stat_key: &str, add: Hits) {
        let key = stat_key.strip_prefix(domain).and_then(|k| k.strip_prefix('.')).unwrap_or(stat_key);
        self.with(|m| {
            let mut id = (domain.to_owned(), key.to_owned());
            let most = if self.max_series == 0 { MAX_SERIES } else { self.max_series };
            if m.hits.len() >= most && !m.hits.contains_key(&id) {
                id = (domain.to_owned(), "_other".to_owned());
            }
            let h = m.hits.entry(id).or_default();
            h.total += add.total;
            h.over += add.over;
            h.near += add.near;
            h.within += add.within;
            h.shadow += add.shadow;
        });
    }

    pub fn latency(&self, took: Duration) {
        let s = took.as_secs_f64();
        self.with(|m| {
            for (i, bound) in BUCKETS.iter().enumerate() {
                if s <= *bound {
                    m.latency[i] += 1;
                }
            }
            m.latency_count += 1;
            m.latency_sum += s;
        });
    }

    pub fn error(&self, kind: &'static str) {
        self.with(|m| *m.errors.entry(kind).or_default() += 1);
    }

    /// One charging statement that carried `calls` calls.
    pub fn charged(&self, calls: usize) {
        if calls > 0 {
            self.with(|m| {
                m.charge_statements += 1;
                m.charged_calls += calls as u64;
            });
        }
    }

    pub fn global_shadow(&self) {
        self.with(|m| m.global_shadow += 1);
    }

    pub fn load(&self, result: &'static str) {
        self.with(|m| *m.loads.entry(result).or_default() += 1);
    }

    pub fn render(&self) -> String {
        fn label(v: &str) -> String {
            v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
        }
        self.with(|m| {
            let mut out = String::new();
            let series: [(&str, Field); 5] = [
                ("total_hits", |h| h.total),
                ("over_limit", |h| h.over),
                ("near_limit", |h| h.near),
                ("within_limit", |h| h.within),
                ("shadow_mode", |h| h.shadow),
            ];
            for (name, get) in series {
                out += &format!("# TYPE ratelimit_service_rate_limit_{name} counter\n");
                for ((domain, key), h) in &m.hits {
                    out += &format!(
                        "ratelimit_service_rate_limit_{name}{{domain=\"{}\",key=\"{}\"}} {}\n",
                        label(domain),
                        label(key),
                        get(h)
                    );
                }
            }
            out += "# TYPE ratelimit_service_should_rate_limit_seconds histogram\n";
            for (i, bound) in BUCKETS.iter().enumerate() {
                out +=
                    &format!("ratelimit_service_should_rate_limit_seconds_bucket{{le=\"{bound}\"}} {}\n", m.latency[i]);
            }
            out += &format!("ratelimit_service_should_rate_limit_seconds_bucket{{le=\"+Inf\"}} {}\n", m.latency_count);
            out += &format!("ratelimit_service_should_rate_limit_seconds_sum {}\n", m.latency_sum);
            out += &format!("ratelimit_service_should_rate_limit_seconds_count {}\n", m.latency_count);
            out += "# TYPE ratelimit_service_errors_total counter\n";
            for (kind, n) in &m.errors {
                out += &format!("ratelimit_service_errors_total{{kind=\"{kind}\"}} {n}\n");
            }
            out += "# TYPE ratelimit_service_config_loads_total counter\n";
            for (result, n) in &m.loads {
                out += &format!("ratelimit_service_config_loads_total{{result=\"{result}\"}} {n}\n");
            }
            for (name, result) in [("success", "ok"), ("error", "error")] {
                out += &format!("# TYPE ratelimit_service_config_load_{name} counter\n");
                out += &format!("ratelimit_service_config_load_{name} {}\n", m.loads.get(result).copied().unwrap_or(0));
            }
            out += "# TYPE ratelimit_service_charge_statements_total counter\n";
            out += &format!("ratelimit_service_charge_statements_total {}\n", m.charge_statements);
            out += "# TYPE ratelimit_service_charged_calls_total counter\n";
            out += &format!("ratelimit_service_charged_calls_total {}\n", m.charged_calls);
            out += "# TYPE ratelimit_service_global_shadow_mode counter\n";
            out += &format!("ratelimit_service_global_shadow_mode {}\n", m.global_shadow);
            out
        })
    }
}

/// A minimal HTTP/1.1 server: `GET /metrics` and `GET /healthcheck`, one request per
/// connection.
pub async fn serve(listener: tokio::net::TcpListener, metrics: std::sync::Arc<Metrics>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 4096];
            let mut read = 0;
            while read < buffer.len() {
                match tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buffer[read..])).await {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => read += n,
                }
                if buffer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buffer[..read]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body, kind) = match path {
                "/metrics" => ("200 OK", metrics.render(), "text/plain; version=0.0.4"),
                "/healthcheck" if metrics.serving.load(std::sync::atomic::Ordering::Relaxed) => {
                    ("200 OK", "OK\n".to_owned(), "text/plain")
                }
                "/healthcheck" => ("503 Service Unavailable", "NOT_SERVING\n".to_owned(), "text/plain"),
                _ => ("404 Not Found", "not found\n".to_owned(), "text/plain"),
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        });
    }
}
