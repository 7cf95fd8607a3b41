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
//! RLS_GRPC, RLS_HTTP, RLS_POOL, RLS_RELOAD_SECONDS, RLS_THREADS,
//! RLS_STATEMENT_TIMEOUT_MS. The reference's own settings are read from the environment
//! under its names (`service::Settings`; CONFIG_TYPE=GRPC_XDS_SOTW: `xds`).

mod batch;
mod config;
mod log;
mod metrics;
mod plan;
mod probe;
mod service;
mod store;
mod xds;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

const USAGE: &str = "ratelimit-rls: Envoy's rate limit service backed by pg_ratelimit

usage: ratelimit-rls --config DIR|FILE --database URL [--grpc ADDR] [--http ADDR] [--pool N] [--reload-seconds S]
       ratelimit-rls --check DIR|FILE     load the configuration, list its domains or say what is wrong, and stop
       ratelimit-rls --probe DOMAIN KEY=VALUE[,KEY=VALUE...]... [--grpc ADDR] [--hits N]
                                          send a running server one call, as Envoy would, and print its answer
                                          (exit 0 OK, 1 OVER_LIMIT, 2 no answer)
       ratelimit-rls --version

  --config          a YAML file, or a folder of them (one domain each), in envoyproxy/ratelimit's format  [RLS_CONFIG]
  --database        postgres://user@host/db (or a libpq keyword string), or sqlite:/path/file.db          [RLS_DATABASE_URL]
  --grpc            ShouldRateLimit and grpc.health.v1 (default 0.0.0.0:8081)                              [RLS_GRPC]
  --http            /metrics and /healthcheck (default 0.0.0.0:8080)                                       [RLS_HTTP]
                    (both bound before serving; port 0 takes a free one, named in the \"serving\" log line)
  --pool            PostgreSQL connections at most (default 16)                                            [RLS_POOL]
  --reload-seconds  how often the config files are looked at for changes (default 1)                       [RLS_RELOAD_SECONDS]
  --threads         worker threads (default 0: one per core; 1 does best beside PostgreSQL on a small machine) [RLS_THREADS]
  --statement-timeout-ms  the longest a decision waits for the database, below Envoy's own timeout
                    (default 40; past it the domain's on_database_error answers)                       [RLS_STATEMENT_TIMEOUT_MS]

The reference server's settings are read from the environment under its names:
  STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, SHADOW_MODE, QUOTA_MODE, RESPONSE_DYNAMIC_METADATA,
  NEAR_LIMIT_RATIO, LIMIT_RESPONSE_HEADERS_ENABLED (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
  LIMIT_RESET_HEADER), MERGE_DOMAIN_CONFIG, and CONFIG_TYPE=GRPC_XDS_SOTW with
  CONFIG_GRPC_XDS_SERVER_URL, CONFIG_GRPC_XDS_NODE_ID, CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
  (configuration pushed over xDS, as Envoy Gateway does; --config is then not needed).
  RLS_MAX_DESCRIPTORS (default 64): a call with more descriptors is over the limit.
  RLS_BATCH_WORKERS (default half the cores): statements charging concurrent calls together, at most.
  RLS_MAX_METRIC_KEYS (default 10000): per-rule metric series past it count under key=\"_other\".";

struct Options {
    config: Option<PathBuf>,
    database: String,
    grpc: String,
    http: String,
    pool: usize,
    reload_seconds: f64,
    threads: Option<usize>,
    statement_timeout: Duration,
}

fn options() -> Result<Options, String> {
    let mut given: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--version" || flag == "-V" {
            println!("ratelimit-rls {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        if flag == "--probe" {
            let rest: Vec<String> = args.by_ref().collect();
            std::process::exit(match probe::parse(&rest) {
                Ok(p) => probe::run(p),
                Err(e) => {
                    eprintln!("{}", serde_json::json!({"error": e}));
                    2
                }
            });
        }
        if flag == "--check" {
            // load the configuration, say what it holds or what is wrong, and stop
            let path = args.next().ok_or("--check needs the configuration's path")?;
            let merge = service::env_bool("MERGE_DOMAIN_CONFIG")?;
            let config = match config::load(std::path::Path::new(&path), merge) {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("{}", serde_json::json!({"error": e}));
                    std::process::exit(2);
                }
            };
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
        if !["config", "database", "grpc", "http", "pool", "reload-seconds", "threads", "statement-timeout-ms"]
            .contains(&name)
        {
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
    let xds = std::env::var("CONFIG_TYPE").is_ok_and(|t| t.eq_ignore_ascii_case("GRPC_XDS_SOTW"));
    Ok(Options {
        config: if xds { None } else { Some(PathBuf::from(get("config", None)?)) },
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
        statement_timeout: get("statement-timeout-ms", Some("40"))?
            .parse::<f64>()
            .ok()
            .filter(|ms| ms.is_finite() && *ms >= 1.0 && *ms <= 600_000.0)
            .map(|ms| Duration::from_secs_f64(ms / 1000.0))
            .ok_or("--statement-timeout-ms must be a number of milliseconds from 1 to 600000")?,
    })
}

/// Reloads the configuration whenever one of its files changes (a bad file keeps the last
/// good configuration, and says why).
async fn watch(
    path: PathBuf,
    every: Duration,
    config: Arc<RwLock<Arc<config::Config>>>,
    metrics: Arc<metrics::Metrics>,
    merge: bool,
) {
    let mut seen = config::files_of(&path).ok();
    loop {
        tokio::time::sleep(every).await;
        let now = config::files_of(&path).ok();
        if now == seen {
            continue;
        }
        seen = now;
        match config::load(&path, merge) {
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

/// The gRPC health service's names for this server: the whole server (""), the
/// reference's own name (`ratelimit`) and the service's.
const HEALTH_NAMES: [&str; 3] = ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"];

/// Serving while the database answers, not while it cannot be reached (Envoy and
/// Kubernetes then send calls to another replica), checked every second.
async fn follow_database(
    store: Arc<store::Store>,
    reporter: tonic_health::server::HealthReporter,
    metrics: Arc<metrics::Metrics>,
    draining: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut was: Option<bool> = None;
    loop {
        let up = store.ping().await && !draining.load(std::sync::atomic::Ordering::Relaxed);
        if draining.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if was != Some(up) {
            let status =
                if up { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
            for name in HEALTH_NAMES {
                reporter.set_service_status(name, status).await;
            }
            metrics.serving.store(up, std::sync::atomic::Ordering::Relaxed);
            if was.is_some() {
                log::line(
                    if up { "info" } else { "error" },
                    if up { "the database answers: serving" } else { "the database does not answer: not serving" },
                    &[],
                );
            }
            was = Some(up);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn run(o: Options) -> Result<(), String> {
    let max_series = match std::env::var("RLS_MAX_METRIC_KEYS") {
        Err(_) => metrics::MAX_SERIES,
        Ok(n) => n.parse().ok().filter(|n| *n >= 1).ok_or("RLS_MAX_METRIC_KEYS must be a whole number above 0")?,
    };
    let metrics = Arc::new(metrics::Metrics::with_max_series(max_series));
    let settings = service::Settings::from_env()?;
    let merge = service::env_bool("MERGE_DOMAIN_CONFIG")?;
    let loaded = match &o.config {
        Some(path) => {
            let loaded = config::load(path, merge)?;
            metrics.load("ok");
            loaded
        }
        None => config::Config::new(merge),
    };
    let domains = loaded.domains.len().to_string();
    let config = Arc::new(RwLock::new(Arc::new(loaded)));
    let store = Arc::new(store::Store::open(&o.database, o.pool, o.statement_timeout)?);
    // both ports are bound before anything is served, so a port in use is named at start;
    // port 0 takes a free one, and the "serving" line says which
    let grpc_addr: std::net::SocketAddr = o.grpc.parse().map_err(|e| format!("--grpc {}: {e}", o.grpc))?;
    let grpc = tonic::transport::server::TcpIncoming::bind(grpc_addr)
        .map_err(|e| format!("--grpc {}: {e}", o.grpc))?
        .with_nodelay(Some(true));
    let grpc_bound = grpc.local_addr().map_err(|e| format!("--grpc {}: {e}", o.grpc))?.to_string();
    let http = tokio::net::TcpListener::bind(&o.http).await.map_err(|e| format!("--http {}: {e}", o.http))?;
    let http_bound = http.local_addr().map_err(|e| format!("--http {}: {e}", o.http))?.to_string();
    tokio::spawn(metrics::serve(http, metrics.clone()));
    match &o.config {
        Some(path) => {
            tokio::spawn(watch(
                path.clone(),
                Duration::from_secs_f64(o.reload_seconds),
                config.clone(),
                metrics.clone(),
                merge,
            ));
        }
        None => {
            tokio::spawn(xds::follow(xds::Source::from_env()?, config.clone(), metrics.clone()));
        }
    }
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, tonic_health::ServingStatus::NotServing).await;
    }
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(follow_database(store.clone(), reporter.clone(), metrics.clone(), draining.clone()));
    let workers = match std::env::var("RLS_BATCH_WORKERS") {
        // few statements at once make big batches: half the cores (the database's
        // backends need the rest), at least one
        Err(_) => (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).clamp(1, o.pool),
        Ok(n) => n.parse().ok().filter(|n| *n >= 1).ok_or("RLS_BATCH_WORKERS must be a whole number above 0")?,
    };
    let batcher = batch::Batcher::start(store.clone(), workers, metrics.clone());
    let rls = service::Rls { config, store, metrics: metrics.clone(), settings, batcher };
    log::line("info", "serving", &[("grpc", &grpc_bound), ("http", &http_bound), ("domains", &domains)]);
    let stopping = async move {
        shutdown_signal().await;
        // tell health checkers first, then finish the calls under way
        draining.store(true, std::sync::atomic::Ordering::Relaxed);
        metrics.serving.store(false, std::sync::atomic::Ordering::Relaxed);
        for name in HEALTH_NAMES {
            reporter.set_service_status(name, tonic_health::ServingStatus::NotServing).await;
        }
        log::line("info", "shutting down: finishing the calls under way", &[]);
    };
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::new(rls))
        .serve_with_incoming_shutdown(grpc, stopping)
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
