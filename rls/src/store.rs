//! Where the functions run: a pool of PostgreSQL connections (the extension or the SQL
//! edition, found on each connection's search_path), or one SQLite file whose functions
//! are registered on the server's own connection (one node only).

use crate::plan::{Param, Sql};
use serde_json::Value;
use std::sync::{Arc, Mutex};

pub enum Store {
    Postgres(deadpool_postgres::Pool),
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
}

impl Store {
    /// `postgres://...` / `postgresql://...` / a libpq keyword string, or `sqlite:PATH`.
    pub fn open(url: &str, pool_size: usize) -> Result<Store, String> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let conn = rusqlite::Connection::open(path).map_err(|e| format!("sqlite {path}: {e}"))?;
            conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(|e| e.to_string())?;
            conn.pragma_update(None, "journal_mode", "wal").map_err(|e| e.to_string())?;
            ratelimit::register(&conn).map_err(|e| format!("sqlite {path}: registering the functions: {e}"))?;
            return Ok(Store::Sqlite(Arc::new(Mutex::new(conn))));
        }
        let config: tokio_postgres::Config = url.parse().map_err(|e| format!("database url: {e}"))?;
        let manager = deadpool_postgres::Manager::from_config(
            config,
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(pool_size)
            .wait_timeout(Some(std::time::Duration::from_secs(5)))
            .create_timeout(Some(std::time::Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Store::Postgres(pool))
    }

    /// Runs one call and parses its JSON answer. An error is either the functions' own
    /// (a bad argument, an unknown policy: `Failure::Refused`) or the database's inability
    /// to decide (down, restarting, the functions missing or not granted: `Unreachable`).
    pub async fn run(&self, sql: &Sql) -> Result<Value, Failure> {
        let text = match self {
            Store::Postgres(pool) => {
                let client = pool.get().await.map_err(|e| Failure::Unreachable(e.to_string()))?;
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
                row.try_get::<_, String>(0).map_err(Failure::of_pg)?
            }
            Store::Sqlite(conn) => {
                let conn = conn.clone();
                let sql = sql.clone();
                tokio::task::spawn_blocking(move || {
                    let conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let mut statement = conn.prepare_cached(&sql.sqlite())?;
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
                    statement.query_row(rusqlite::params_from_iter(params), |row| row.get::<_, String>(0))
                })
                .await
                .map_err(|e| Failure::Unreachable(e.to_string()))?
                .map_err(|e| {
                    // the functions' own errors name the function; anything else (a busy or
                    // broken file) leaves the database unable to decide
                    let text = e.to_string();
                    if text.starts_with("rl_") {
                        Failure::Refused(text)
                    } else {
                        Failure::Unreachable(text)
                    }
                })?
            }
        };
        serde_json::from_str(&text).map_err(|e| Failure::Refused(format!("{}: answer not JSON: {e}", sql.function)))
    }
}

#[derive(Debug)]
pub enum Failure {
    /// The database answered with an error: the call itself is wrong.
    Refused(String),
    /// No decision: the database is down, restarting or unreachable, or lacks the functions.
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
