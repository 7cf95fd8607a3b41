//! In-server tests (cargo pgrx test): the contract through SPI, with SQLSTATEs.

use pgrx::prelude::*;
use pgrx::JsonB;

fn json(sql: &str) -> serde_json::Value {
    Spi::get_one::<JsonB>(sql).expect("query runs").expect("never NULL").0
}

fn explicit_clock() {
    Spi::run("SET pg_ratelimit.allow_explicit_clock = on").unwrap();
}

#[pg_test]
fn contract_example_burst_3_refill_60() {
    explicit_clock();
    // (now_ms, admitted, remaining, retry_after_ms)
    for (now, admitted, remaining, retry) in [(0, true, 2, 0), (0, true, 1, 0), (0, true, 0, 0), (0, false, 0, 1000), (999, false, 0, 1), (1000, true, 0, 0)] {
        let r = json(&format!("SELECT rl_take('a', 3, 60, 1, {now})"));
        assert_eq!(r["admitted"], admitted, "{now}: {r}");
        assert_eq!(r["remaining"], remaining, "{now}: {r}");
        assert_eq!(r["retry_after_ms"], retry, "{now}: {r}");
    }
    assert_eq!(json("SELECT rl_take('b', 3, 60, 1, 0)")["remaining"], 2);
}

#[pg_test]
fn budgets_are_exact_and_peek_spends_nothing() {
    explicit_clock();
    for _ in 0..10 {
        assert_eq!(json("SELECT rl_spend('k', 'day', 1, 0.1, 0)")["admitted"], true);
    }
    let peek = json("SELECT rl_budget('k', 'day', 1, 0.1, 0)");
    assert_eq!(peek.to_string(), r#"{"admitted":false,"limit":1,"remaining":0,"resets_at":86400,"retry_after_seconds":86400,"used":1}"#);
    assert_eq!(json("SELECT rl_spend('k', 'month', 1, 1, 0)")["admitted"], true, "periods are separate");
}

#[pg_test]
fn sweep_removes_only_finished_rows() {
    explicit_clock();
    json("SELECT rl_take('s', 2, 60, 2, 0)");
    assert_eq!(Spi::get_one::<i64>("SELECT rl_sweep(1999)").unwrap(), Some(0));
    assert_eq!(Spi::get_one::<i64>("SELECT rl_sweep(2000)").unwrap(), Some(1));
}

/// Each bad input raises 22023 with the core's message, and writes nothing.
#[pg_test]
fn bad_input_raises_22023() {
    explicit_clock();
    let cases = [
        ("SELECT rl_take(NULL, 3, 60)", "rl_take: key must be text, got NULL"),
        ("SELECT rl_take('', 3, 60)", "rl_take: key must not be empty"),
        ("SELECT rl_take(repeat('x', 1025), 3, 60)", "rl_take: key must be at most 1024 bytes, got 1025 bytes"),
        ("SELECT rl_take('k', 0, 60)", "rl_take: burst must be a finite number greater than 0, got 0"),
        ("SELECT rl_take('k', 'NaN', 60)", "rl_take: burst must be a finite number greater than 0, got NaN"),
        ("SELECT rl_take('k', 3, 'Infinity')", "rl_take: refill_per_minute must be a finite number greater than 0, got Infinity"),
        ("SELECT rl_take('k', 3, 60, -1)", "rl_take: cost must be a finite number greater than 0, got -1"),
        ("SELECT rl_take('k', 3, 60, 1, -1)", "rl_take: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got -1"),
        ("SELECT rl_spend('k', 'year', 3)", "rl_spend: period must be 'day' or 'month', got 'year'"),
        ("SELECT rl_spend('k', 'day', NULL)", "rl_spend: quota must be a finite number greater than 0, got NULL"),
        ("SELECT rl_budget('k', 'day', 3, 0)", "rl_budget: cost must be a finite number greater than 0, got 0"),
        ("SELECT rl_sweep(1.5)", "rl_sweep: now_ms must be an integer number of epoch milliseconds from 0 to 253402300799999, got 1.5"),
        ("SELECT rl_key('a', NULL)", "rl_key: part 2 must not be NULL"),
    ];
    for (sql, message) in cases {
        let caught = PgTryBuilder::new(|| {
            Spi::run(sql).unwrap();
            None
        })
        .catch_others(|e| match e {
            pg_sys::panic::CaughtError::PostgresError(report) | pg_sys::panic::CaughtError::ErrorReport(report) => {
                Some((report.sql_error_code(), report.message().to_owned()))
            }
            other => panic!("{sql}: unexpected {other:?}"),
        })
        .execute();
        assert_eq!(caught, Some((PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message.to_owned())), "{sql}");
    }
    assert_eq!(Spi::get_one::<i64>("SELECT count(*) FROM ratelimit.rl_bucket").unwrap(), Some(0));
}

#[pg_test(error = "rl_take: an explicit now_ms is not allowed unless pg_ratelimit.allow_explicit_clock is on")]
fn explicit_clock_is_refused_by_default() {
    Spi::run("SELECT rl_take('k', 3, 60, 1, 0)").unwrap();
}
