//! Where the functions run: a pool of PostgreSQL connections (the extension or the SQL
//! edition, found on each connection's search_path), or one SQLite file whose functions
//! are registered on the server's own connection (one node only).
//!
//! Every statement has a deadline (`--statement-timeout-ms`, below Envoy's own timeout, so
//! that `on_database_error` decides rather than Envoy): a PostgreSQL statement past it is
//! cancelled on the server and its connection dropped from the pool, and so is one whose
//! caller went away (Envoy gave up), so that no abandoned query holds a pooled
//! connection; a SQLite statement that waited past it for the file is not run.

use crate::plan::{Param, Sql};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub enum Store {
    Postgres { pool: deadpool_postgres::Pool, deadline: Duration },
    Sqlite { conn: Arc<Mutex<rusqlite::Connection>>, deadline: Duration },
}

/// A pooled connection with a statement under way: dropped before it finishes (a deadline
/// passed, or the call was cancelled), the statement is cancelled on the server and the
/// connection leaves the pool instead of going back to it with a query queued.
struct InFlight {
    client: Option<deadpool_postgres::Object>,
}

impl InFlight {
    fn done(mut self) -> deadpool_postgres::Object {
        self.client.take().expect("held until done")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let cancel = client.cancel_token();
            drop(deadpool_postgres::Object::take(client));
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = cancel.cancel_query(tokio_postgres::NoTls).await;
                });
            }
        }
    }
}

impl Store {
    /// `postgres://...` / `postgresql://...` / a libpq keyword string, or `sqlite:PATH`.
    pub fn open(url: &str, pool_size: usize, deadline: Duration) -> Result<Store, String> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let conn = rusqlite::Connection::open(path).map_err(|e| format!("sqlite {path}: {e}"))?;
            conn.busy_timeout(deadline).map_err(|e| e.to_string())?;
            conn.pragma_update(None, "journal_mode", "wal").map_err(|e| e.to_string())?;
            ratelimit::register(&conn).map_err(|e| format!("sqlite {path}: registering the functions: {e}"))?;
            return Ok(Store::Sqlite { conn: Arc::new(Mutex::new(conn)), deadline });
        }
        let config: tokio_postgres::Config = url.parse().map_err(|e| format!("database url: {e}"))?;
        let manager = deadpool_postgres::Manager::from_config(
            config,
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(pool_size)
            .wait_timeout(Some(deadline))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Store::Postgres { pool, deadline })
    }

    /// The statement timeout.
    pub fn deadline(&self) -> Duration {
        match self {
            Store::Postgres { deadline, .. } | Store::Sqlite { deadline, .. } => *deadline,
        }
    }

    /// Whether the database answers at all (the health services ask every second).
    pub async fn ping(&self) -> bool {
        match self {
            Store::Postgres { pool, .. } => {
                let probe = async {
                    let client = pool.get().await.ok()?;
                    client.simple_query("SELECT 1").await.ok()
                };
                matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some(_)))
            }
            Store::Sqlite { conn, .. } => {
                let conn = conn.clone();
                tokio::task::spawn_blocking(move || {
                    let conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    conn.query_row("SELECT 1", [], |row| row.get::<_, i64>(0)).is_ok()
                })
                .await
                .unwrap_or(false)
            }
        }
    }

    /// Runs one call and parses its JSON answer. An error is either the functions' own
    /// (a bad argument, an unknown policy: `Failure::Refused`) or the database's inability
    /// to decide in time (down, restarting, slow, the functions missing or not granted:
    /// `Unreachable`).
    pub async fn run(&self, sql: &Sql) -> Result<Value, Failure> {
        let text = match self {
            Store::Postgres { pool, deadline } => {
                let client = pool.get().await.map_err(|e| Failure::Unreachable(e.to_string()))?;
                let held = InFlight { client: Some(client) };
                let query = async {
                    let client = held.client.as_ref().expect("held");
                    let statement = client.prepare_cached(&sql.postgres()).await.map_err(Failure::of_pg)?;
                    let params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = sql
                        .params
                        .iter()
                        .map(|p| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
                            match p {
                                Param::Text(t) | Param::Json(t) => Box::new(t.clone()),
                                Param::Real(r) => Box::new(*r),
                                Param::MaybeText(t) => Box::new(t.clone()),
                            }
                        })
                        .collect();
                    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                        params.iter().map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
                    let row = client.query_one(&statement, &refs).await.map_err(Failure::of_pg)?;
                    row.try_get::<_, String>(0).map_err(Failure::of_pg)
                };
                match tokio::time::timeout(*deadline, query).await {
                    Ok(answer) => {
                        drop(held.done());
                        answer?
                    }
                    // `held` is dropped here: the statement is cancelled, the connection gone
                    Err(_) => {
                        return Err(Failure::Unreachable(format!(
                            "{}: no answer within the statement timeout ({} ms)",
                            sql.function,
                            deadline.as_millis()
                        )))
                    }
                }
            }
            Store::Sqlite { conn, deadline } => {
                let conn = conn.clone();
                let sql = sql.clone();
                let deadline = *deadline;
                let asked = Instant::now();
                let work = tokio::task::spawn_blocking(move || {
                    let conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    if asked.elapsed() > deadline {
                        // the caller has been answered already: not run
                        return Err(None);
                    }
                    let mut statement = conn.prepare_cached(&sql.sqlite()).map_err(Some)?;
                    let params: Vec<rusqlite::types::Value> = sql
                        .params
                        .iter()
                        .map(|p| match p {
                            Param::Text(t) | Param::Json(t) => rusqlite::types::Value::Text(t.clone()),
                            Param::Real(r) => rusqlite::types::Value::Real(*r),
                            Param::MaybeText(t) => {
                                t.clone().map_or(rusqlite::types::Value::Null, rusqlite::types::Value::Text)
                            }
                        })
                        .collect();
                    statement.query_row(rusqlite::params_from_iter(params), |row| row.get::<_, String>(0)).map_err(Some)
                });
                let late = || {
                    Failure::Unreachable(format!(
                        "no answer within the statement timeout ({} ms)",
                        deadline.as_millis()
                    ))
                };
                match tokio::time::timeout(deadline, work).await {
                    Err(_) => return Err(late()),
                    Ok(Err(e)) => return Err(Failure::Unreachable(e.to_string())),
                    Ok(Ok(Err(None))) => return Err(late()),
                    Ok(Ok(Err(Some(e)))) => {
                        // the functions' own errors name the function; anything else (a busy
                        // or broken file) leaves the database unable to decide
                        let text = e.to_string();
                        return Err(if text.starts_with("rl_") {
                            Failure::Refused(text)
                        } else {
                            Failure::Unreachable(text)
                        });
                    }
                    Ok(Ok(Ok(text))) => text,
                }
            }
        };
        serde_json::from_str(&text).map_err(|e| Failure::Unreachable(format!("{}: answer not JSON: {e}", sql.function)))
    }
}

#[derive(Debug)]
pub enum Failure {
    /// The database answered with an error: the call itself is wrong.
    Refused(String),
    /// No decision: the database is down, restarting, slow or unreachable, or lacks the
    /// functions.
    Unreachable(String),
}

impl Failure {
    fn of_pg(e: tokio_postgres::Error) -> Failure {
        match e.as_db_error() {
            // the functions refuse bad arguments (class 22) and unknown policies (42704);
            // anything else (a server shutting down, a missing function, a missing grant)
            // leaves the database unable to decide
            Some(db) if db.code().code().starts_with("22") || db.code().code() == "42704" => {
                Failure::Refused(format!("{}: {}", db.code().code(), db.message()))
            }
            Some(db) => Failure::Unreachable(format!("{}: {}", db.code().code(), db.message())),
            None => Failure::Unreachable(e.to_string()),
        }
    }
}
