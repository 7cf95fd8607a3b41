//! ratelimit-rls: Envoy's rate limit service (envoy.service.ratelimit.v3) with its limits
//! kept by pg_ratelimit in PostgreSQL (the extension or the SQL edition), or by sqlite
//! ratelimit in one file for a single node. Configured in envoyproxy/ratelimit's format.
//!
//! ```text
//! ratelimit-rls --config DIR|FILE --database URL [--grpc ADDR] [--http ADDR]
//!               [--pool N] [--reload-seconds S] [--threads N]
//! ```
//! `--database`: `postgres://user@host/db` (any libpq-style URL or keyword string), or
//! `sqlite:/path/file.db`. `--grpc` (default 0.0.0.0:8081) serves ShouldRateLimit and
//! grpc.health.v1; `--http` (default 0.0.0.0:8080) serves /metrics and /healthcheck.
//! Every option can come from the environment instead: RLS_CONFIG, RLS_DATABASE_URL,
//! RLS_GRPC, RLS_HTTP, RLS_POOL, RLS_RELOAD_SECONDS, RLS_THREADS.

mod config;
mod log;
mod metrics;
mod plan;
mod service;
mod store;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

const USAGE: &str = "ratelimit-rls: Envoy's rate limit service backed by pg_ratelimit

usage: ratelimit-rls --config DIR|FILE --database URL [--grpc ADDR] [--http ADDR] [--pool N] [--reload-seconds S]
       ratelimit-rls --check DIR|FILE     load the configuration, list its domains or say what is wrong, and stop

  --config          a YAML file, or a folder of them (one domain each), in envoyproxy/ratelimit's format  [RLS_CONFIG]
  --database        postgres://user@host/db (or a libpq keyword string), or sqlite:/path/file.db          [RLS_DATABASE_URL]
  --grpc            ShouldRateLimit and grpc.health.v1 (default 0.0.0.0:8081)                              [RLS_GRPC]
  --http            /metrics and /healthcheck (default 0.0.0.0:8080)                                       [RLS_HTTP]
  --pool            PostgreSQL connections at most (default 16)                                            [RLS_POOL]
  --reload-seconds  how often the config files are looked at for changes (default 1)                       [RLS_RELOAD_SECONDS]
  --threads         worker threads (default 0: one per core; 1 does best beside PostgreSQL on a small machine) [RLS_THREADS]";

struct Options {
    config: PathBuf,
    database: String,
    grpc: String,
    http: String,
    pool: usize,
    reload_seconds: f64,
    threads: Option<usize>,
}

fn options() -> Result<Options, String> {
    let mut given: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--check" {
            // load the configuration, say what it holds or what is wrong, and stop
            let path = args.next().ok_or("--check needs the configuration's path")?;
            let config = config::load(std::path::Path::new(&path))?;
            let mut domains: Vec<&String> = config.domains.keys().collect();
            domains.sort();
            println!(
                "{path}: {} domain(s): {}",
                domains.len(),
                domains.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")
            );
            std::process::exit(0);
        }
        let name = flag.strip_prefix("--").ok_or_else(|| format!("unexpected argument {flag:?}"))?;
        if !["config", "database", "grpc", "http", "pool", "reload-seconds", "threads"].contains(&name) {
            return Err(format!("unknown option --{name}"));
        }
        let value = args.next().ok_or_else(|| format!("--{name} needs a value"))?;
        given.insert(name.to_owned(), value);
    }
    let get = |name: &str, default: Option<&str>| -> Result<String, String> {
        let env = format!("RLS_{}", name.to_uppercase().replace('-', "_"));
        let env = if name == "database" { "RLS_DATABASE_URL".to_owned() } else { env };
        given
            .get(name)
            .cloned()
            .or_else(|| std::env::var(&env).ok())
            .or(default.map(str::to_owned))
            .ok_or_else(|| format!("--{name} (or {env}) is required"))
    };
    Ok(Options {
        config: PathBuf::from(get("config", None)?),
        database: get("database", None)?,
        grpc: get("grpc", Some("0.0.0.0:8081"))?,
        http: get("http", Some("0.0.0.0:8080"))?,
        pool: get("pool", Some("16"))?
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or("--pool must be a whole number above 0")?,
        reload_seconds: get("reload-seconds", Some("1"))?
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s > 0.0)
            .ok_or("--reload-seconds must be a number above 0")?,
        threads: match get("threads", Some("0"))?.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return Err("--threads must be a whole number (0: one per core)".into()),
        },
    })
}

/// Reloads the configuration whenever one of its files changes (a bad file keeps the last
/// good configuration, and says why).
async fn watch(
    path: PathBuf,
    every: Duration,
    config: Arc<RwLock<Arc<config::Config>>>,
    metrics: Arc<metrics::Metrics>,
) {
    let mut seen = config::files_of(&path).ok();
    loop {
        tokio::time::sleep(every).await;
        let now = config::files_of(&path).ok();
        if now == seen {
            continue;
        }
        seen = now;
        match config::load(&path) {
            Ok(fresh) => {
                let domains = fresh.domains.len().to_string();
                *config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
                metrics.load("ok");
                log::line("info", "configuration reloaded", &[("domains", &domains)]);
            }
            Err(e) => {
                metrics.load("error");
                log::line("error", "configuration not reloaded; the last good one stays", &[("error", &e)]);
            }
        }
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

async fn run(o: Options) -> Result<(), String> {
    let metrics = Arc::new(metrics::Metrics::default());
    let loaded = config::load(&o.config)?;
    metrics.load("ok");
    let domains = loaded.domains.len().to_string();
    let config = Arc::new(RwLock::new(Arc::new(loaded)));
    let store = store::Store::open(&o.database, o.pool)?;
    let grpc: std::net::SocketAddr = o.grpc.parse().map_err(|e| format!("--grpc {}: {e}", o.grpc))?;
    let http = tokio::net::TcpListener::bind(&o.http).await.map_err(|e| format!("--http {}: {e}", o.http))?;
    tokio::spawn(metrics::serve(http, metrics.clone()));
    tokio::spawn(watch(o.config.clone(), Duration::from_secs_f64(o.reload_seconds), config.clone(), metrics.clone()));
    let (reporter, health) = tonic_health::server::health_reporter();
    const NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    reporter.set_service_status(NAME, tonic_health::ServingStatus::Serving).await;
    let rls = service::Rls { config, store, metrics };
    log::line("info", "serving", &[("grpc", &o.grpc), ("http", &o.http), ("domains", &domains)]);
    let stopping = async move {
        shutdown_signal().await;
        // tell health checkers first, then finish the calls under way
        reporter.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        reporter.set_service_status(NAME, tonic_health::ServingStatus::NotServing).await;
        log::line("info", "shutting down: finishing the calls under way", &[]);
    };
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::new(rls))
        .serve_with_shutdown(grpc, stopping)
        .await
        .map_err(|e| format!("--grpc {}: {e}", o.grpc))?;
    log::line("info", "stopped", &[]);
    Ok(())
}

fn main() {
    let outcome = options().and_then(|o| {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = o.threads {
            runtime.worker_threads(n);
        }
        runtime.enable_all().build().map_err(|e| e.to_string())?.block_on(run(o))
    });
    if let Err(e) = outcome {
        log::line("error", "ratelimit-rls cannot start", &[("error", &e)]);
        std::process::exit(2);
    }
}
