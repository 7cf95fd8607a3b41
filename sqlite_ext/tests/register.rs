//! register(&conn) on an application's own rusqlite connection, SQLite linked normally:
//! `cargo test -p sqlite_ratelimit --no-default-features` (a build of its own: the loadable
//! feature must not be unified with a crate that links SQLite).
#![cfg(not(feature = "loadable"))]

use rusqlite::Connection;

#[test]
fn register_gives_the_same_functions_without_load() {
    let conn = Connection::open_in_memory().unwrap();
    ratelimit::register(&conn).unwrap();
    let take = |now: i64| -> String {
        conn.query_row("SELECT rl_take('user:42', 3, 60, 1, ?1)", [now], |r| r.get(0)).unwrap()
    };
    assert_eq!(
        take(0),
        r#"{"admitted":true,"remaining":2,"limit":3,"retry_after_ms":0,"retry_after_seconds":0,"reset_after_seconds":1,"exceeds_limit":false,"refill_seconds":3}"#
    );
    take(0);
    take(0);
    assert!(take(0).starts_with(r#"{"admitted":false,"remaining":0,"limit":3,"retry_after_ms":1000"#));
    let version: String = conn.query_row("SELECT rl_version()", [], |r| r.get(0)).unwrap();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    let err = conn.query_row("SELECT rl_take('k', 0, 60)", [], |r| r.get::<_, String>(0)).unwrap_err();
    assert_eq!(err.to_string(), "rl_take: burst must be a finite number greater than 0, got 0");
    // the statement cache goes with the connection: it closes cleanly
    conn.close().map_err(|(_, e)| e).unwrap();
}
