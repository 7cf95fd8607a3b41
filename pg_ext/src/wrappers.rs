//! One SQL function per entry of the core's table, each a few lines: PostgreSQL's
//! arguments converted to the core's [`Arg`]s in the descriptor's order, then [`run`].

use crate::dispatch::{raise, run};
use crate::jsonb::{JsonbArg, JsonbResult};
use crate::shared_memory;
use pgrx::prelude::*;
use ratelimit_core::functions::{self as f, Function};
use ratelimit_core::render::ToJson;
use ratelimit_core::Arg;

/// A jsonb argument as JSON text, read no further than the core's bound on JSON arguments.
fn json_text(function: &Function, name: &str, v: Option<JsonbArg>) -> Option<String> {
    let bound = ratelimit_core::units::MAX_JSON_BYTES;
    v.map(|j| {
        j.text(bound)
            .unwrap_or_else(|bytes| raise(ratelimit_core::args::json_too_large(name, bytes).in_function(function.name)))
    })
}

pub(crate) fn text(v: Option<&str>) -> Arg<'_> {
    v.map_or(Arg::Null, Arg::Text)
}

pub(crate) fn real(v: Option<f64>) -> Arg<'static> {
    v.map_or(Arg::Null, Arg::Real)
}

pub(crate) fn int(v: Option<i64>) -> Arg<'static> {
    v.map_or(Arg::Null, Arg::Integer)
}

/// Wrappers of functions that share a signature: rl_take, its compact answer and rl_peek (a
/// bucket), rl_spend and rl_budget (a budget), the windows.
macro_rules! wrappers {
    ($($name:ident($key:ident, $second:ident: $second_type:ty, $third:ident) -> $returns:ty = $descriptor:ident, $second_arg:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name(
            $key: Option<&str>,
            $second: Option<$second_type>,
            $third: Option<f64>,
            cost: default!(Option<f64>, 1),
            now_ms: default!(Option<f64>, "NULL"),
        ) -> $returns {
            run(&f::$descriptor, &[text($key), $second_arg($second), real($third), real(cost), real(now_ms)])
        }
    )*};
}

wrappers! {
    rl_take(key, burst: f64, refill_per_minute) -> JsonbResult = RL_TAKE, real;
    rl_take_compact(key, burst: f64, refill_per_minute) -> String = RL_TAKE_COMPACT, real;
    rl_peek(key, burst: f64, refill_per_minute) -> JsonbResult = RL_PEEK, real;
    rl_spend(key, period: &str, quota) -> JsonbResult = RL_SPEND, text;
    rl_budget(key, period: &str, quota) -> JsonbResult = RL_BUDGET, text;
    rl_window(key, limit: f64, window_seconds) -> JsonbResult = RL_WINDOW, real;
    rl_window_peek(key, limit: f64, window_seconds) -> JsonbResult = RL_WINDOW_PEEK, real;
    rl_fixed_window(key, limit: f64, window_seconds) -> JsonbResult = RL_FIXED_WINDOW, real;
    rl_fixed_window_peek(key, limit: f64, window_seconds) -> JsonbResult = RL_FIXED_WINDOW_PEEK, real;
}

/// Wrappers of functions whose arguments are all required but a trailing now_ms; each
/// argument converted to a core value by `text`, `real` or `int`.
macro_rules! now_last_wrappers {
    ($($name:ident($($arg:ident: $t:ty => $to_arg:ident),*) -> $returns:ty = $descriptor:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name($($arg: Option<$t>,)* now_ms: default!(Option<f64>, "NULL")) -> $returns {
            run(&f::$descriptor, &[$($to_arg($arg),)* real(now_ms)])
        }
    )*};
}

now_last_wrappers! {
    rl_refund(key: &str => text, burst: f64 => real, refill_per_minute: f64 => real, amount: f64 => real)
        -> JsonbResult = RL_REFUND;
    rl_charge(key: &str => text, burst: f64 => real, refill_per_minute: f64 => real, amount: f64 => real)
        -> JsonbResult = RL_CHARGE;
    rl_refund_budget(key: &str => text, period: &str => text, amount: f64 => real) -> JsonbResult = RL_REFUND_BUDGET;
    rl_charge_budget(key: &str => text, period: &str => text, amount: f64 => real) -> JsonbResult = RL_CHARGE_BUDGET;
    rl_acquire(key: &str => text, max_in_flight: i64 => int, lease_seconds: f64 => real) -> JsonbResult = RL_ACQUIRE;
    rl_release(key: &str => text, lease: &str => text) -> bool = RL_RELEASE;
    rl_renew(key: &str => text, lease: &str => text, lease_seconds: f64 => real) -> JsonbResult = RL_RENEW;
    rl_in_flight(key: &str => text) -> i64 = RL_IN_FLIGHT;
}

// Only rl_sweep pins its search_path: its statements use IN, whose `=` is found through
// the search_path. Every other function runs statements that qualify every name and
// operator (see ratelimit_core::sql), and saves the cost of switching search_path.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, ratelimit, pg_temp)]
fn rl_sweep(now_ms: default!(Option<f64>, "NULL"), max_rows: default!(Option<i64>, "NULL")) -> i64 {
    run::<i64>(&f::RL_SWEEP, &[real(now_ms), int(max_rows)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_reset(key: Option<&str>) -> i64 {
    run::<i64>(&f::RL_RESET, &[text(key)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_policy_set(name: Option<&str>, definition: Option<JsonbArg>) -> JsonbResult {
    let definition = json_text(&f::RL_POLICY_SET, "definition", definition);
    run(&f::RL_POLICY_SET, &[text(name), text(definition.as_deref())])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_policy_drop(name: Option<&str>) -> bool {
    run(&f::RL_POLICY_DROP, &[text(name)])
}

/// rl_check, its compact answer, rl_refund_check and rl_peek_check: `(policy, subject [, cost
/// = 1 [, tier [, now_ms]]])`.
macro_rules! policy_wrappers {
    ($($name:ident -> $returns:ty = $descriptor:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name(
            policy: Option<&str>,
            subject: Option<&str>,
            cost: default!(Option<f64>, 1),
            tier: default!(Option<&str>, "NULL"),
            now_ms: default!(Option<f64>, "NULL"),
        ) -> $returns {
            run(&f::$descriptor, &[text(policy), text(subject), real(cost), text(tier), real(now_ms)])
        }
    )*};
}

policy_wrappers! {
    rl_check -> JsonbResult = RL_CHECK;
    rl_check_compact -> String = RL_CHECK_COMPACT;
    rl_refund_check -> JsonbResult = RL_REFUND_CHECK;
    rl_peek_check -> JsonbResult = RL_PEEK_CHECK;
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_charge_check(
    policy: Option<&str>,
    subject: Option<&str>,
    amount: Option<f64>,
    tier: default!(Option<&str>, "NULL"),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbResult {
    run(&f::RL_CHARGE_CHECK, &[text(policy), text(subject), real(amount), text(tier), real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_penalize(
    subject: Option<&str>,
    free_strikes: default!(Option<i64>, 3),
    base_seconds: default!(Option<f64>, 60),
    max_seconds: default!(Option<f64>, 3600),
    window_seconds: default!(Option<f64>, 3600),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbResult {
    let escalation = [int(free_strikes), real(base_seconds), real(max_seconds), real(window_seconds)];
    run(&f::RL_PENALIZE, &[text(subject), escalation[0], escalation[1], escalation[2], escalation[3], real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_block(subject: Option<&str>, seconds: Option<f64>, now_ms: default!(Option<f64>, "NULL")) -> JsonbResult {
    run(&f::RL_BLOCK, &[text(subject), real(seconds), real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_unblock(subject: Option<&str>, now_ms: default!(Option<f64>, "NULL")) -> bool {
    run(&f::RL_UNBLOCK, &[text(subject), real(now_ms)])
}

/// rl_take_all, its compact answer, rl_refund_all and rl_charge_all: `(limits [, now_ms])`.
macro_rules! limits_wrappers {
    ($($name:ident -> $returns:ty = $descriptor:ident;)*) => {$(
        #[pg_extern(volatile, parallel_unsafe, security_definer)]
        fn $name(limits: Option<JsonbArg>, now_ms: default!(Option<f64>, "NULL")) -> $returns {
            let limits = json_text(&f::$descriptor, "limits", limits);
            run(&f::$descriptor, &[text(limits.as_deref()), real(now_ms)])
        }
    )*};
}

limits_wrappers! {
    rl_take_all -> JsonbResult = RL_TAKE_ALL;
    rl_take_all_compact -> String = RL_TAKE_ALL_COMPACT;
    rl_refund_all -> JsonbResult = RL_REFUND_ALL;
    rl_charge_all -> JsonbResult = RL_CHARGE_ALL;
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_check_limits(
    name: Option<&str>,
    subject: Option<&str>,
    limits: Option<JsonbArg>,
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbResult {
    let limits = json_text(&f::RL_CHECK_LIMITS, "limits", limits);
    run(&f::RL_CHECK_LIMITS, &[text(name), text(subject), text(limits.as_deref()), real(now_ms)])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_version() -> String {
    run(&f::RL_VERSION, &[])
}

#[pg_extern(volatile, parallel_safe)]
fn rl_memory_stats() -> JsonbResult {
    match shared_memory::stats() {
        Some(stats) => JsonbResult(stats.to_json()),
        None => raise(ratelimit_core::Error::memory_store_not_loaded().in_function(f::RL_MEMORY_STATS.name)),
    }
}

#[pg_extern(volatile, parallel_restricted)]
fn rl_policy_stats() -> JsonbResult {
    run(&f::RL_POLICY_STATS, &[])
}

#[pg_extern(volatile, parallel_unsafe)]
fn rl_stats_reset() -> i64 {
    run(&f::RL_STATS_RESET, &[])
}

#[pg_extern(volatile, parallel_restricted)]
fn rl_top_refused(policy: Option<&str>, n: default!(Option<i64>, 10)) -> JsonbResult {
    run(&f::RL_TOP_REFUSED, &[text(policy), int(n)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_budgets_near(
    fraction: Option<f64>,
    n: default!(Option<i64>, 100),
    now_ms: default!(Option<f64>, "NULL"),
) -> JsonbResult {
    run(&f::RL_BUDGETS_NEAR, &[real(fraction), int(n), real(now_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_usage(key: Option<&str>, from_ms: Option<f64>, to_ms: Option<f64>) -> JsonbResult {
    run(&f::RL_USAGE, &[text(key), real(from_ms), real(to_ms)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_usage_all(
    from_ms: Option<f64>,
    to_ms: Option<f64>,
    after: default!(Option<JsonbArg>, "NULL"),
    n: default!(Option<i64>, 1000),
) -> JsonbResult {
    let after = json_text(&f::RL_USAGE_ALL, "after", after);
    run(&f::RL_USAGE_ALL, &[real(from_ms), real(to_ms), text(after.as_deref()), int(n)])
}

#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn rl_usage_retention(days: default!(Option<i64>, "NULL")) -> i64 {
    run::<i64>(&f::RL_USAGE_RETENTION, &[int(days)])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_headers(result: Option<JsonbArg>) -> JsonbResult {
    let result = json_text(&f::RL_HEADERS, "result", result);
    run(&f::RL_HEADERS, &[text(result.as_deref())])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_policy_validate(definition: Option<JsonbArg>) -> JsonbResult {
    let definition = json_text(&f::RL_POLICY_VALIDATE, "definition", definition);
    run(&f::RL_POLICY_VALIDATE, &[text(definition.as_deref())])
}

#[pg_extern(immutable, parallel_safe)]
fn rl_key(parts: Option<VariadicArray<'_, &str>>) -> String {
    let args: Vec<Arg> = match &parts {
        Some(p) => p.iter().map(text).collect(),
        None => vec![Arg::Null],
    };
    run(&f::RL_KEY, &args)
}

// The internal functions of the guarded UPDATEs (sql/statements/bucket_change.sql,
// sql/statements/budget_change.sql; see ratelimit_core::decision_slot). A high cost keeps the guards
// after the key comparison. Nobody else can call them (no privileges on schema ratelimit),
// and outside those statements they fail.
#[pg_schema]
mod ratelimit {
    use super::{real, run};
    use pgrx::prelude::*;
    use ratelimit_core::functions as f;
    use ratelimit_core::Arg;

    #[pg_extern(volatile, parallel_unsafe, cost = 1000)]
    fn rl_bucket_guard(level: f64, refilled_at: i64, full_at: i64) -> bool {
        run(&f::RL_BUCKET_GUARD, &[real(Some(level)), Arg::Integer(refilled_at), Arg::Integer(full_at)])
    }

    #[pg_extern(volatile, parallel_unsafe, cost = 1000)]
    fn rl_budget_guard(used: i64, resets_at: i64, quota: i64) -> bool {
        run(&f::RL_BUDGET_GUARD, &[Arg::Integer(used), Arg::Integer(resets_at), Arg::Integer(quota)])
    }

    /// The SET clauses: the row the guard decided to write, column by column.
    macro_rules! decided {
        ($($name:ident -> $t:ty = $descriptor:ident;)*) => {$(
            #[pg_extern(volatile, parallel_unsafe)]
            fn $name() -> $t {
                run(&f::$descriptor, &[])
            }
        )*};
    }

    decided! {
        rl_bucket_new_level -> f64 = RL_BUCKET_NEW_LEVEL;
        rl_bucket_new_refilled_at -> i64 = RL_BUCKET_NEW_REFILLED_AT;
        rl_bucket_new_full_at -> i64 = RL_BUCKET_NEW_FULL_AT;
        rl_budget_new_used -> i64 = RL_BUDGET_NEW_USED;
        rl_budget_new_resets_at -> i64 = RL_BUDGET_NEW_RESETS_AT;
        rl_budget_new_quota -> i64 = RL_BUDGET_NEW_QUOTA;
    }
}
