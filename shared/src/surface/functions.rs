//! Every SQL function of the extension, described once. The SQLite extension registers
//! from this table, `sql/schema/pg_finalize.sql` (comments, privileges) is generated from it, the
//! client tests read their function lists from its copy `tests/functions.json`, and an
//! in-server test compares PostgreSQL's catalog with it, so a wrapper that drifts fails.
//!
//! Adding a function: a descriptor here (and in [`ALL`]), its entry in [`crate::calls`],
//! one pgrx wrapper, tests; then `RL_BLESS=1 cargo test -p ratelimit_codegen --test generated`
//! rewrites the generated files.

use crate::error::Result;

/// A SQL type as PostgreSQL names it (SQLite takes any value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlType {
    Text,
    Float8,
    Int8,
    Bool,
    Jsonb,
}

impl SqlType {
    pub const fn pg_name(self) -> &'static str {
        match self {
            SqlType::Text => "text",
            SqlType::Float8 => "double precision",
            SqlType::Int8 => "bigint",
            SqlType::Bool => "boolean",
            SqlType::Jsonb => "jsonb",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub sql_type: SqlType,
    /// The default as SQL text; None: the argument is required.
    pub default: Option<&'static str>,
    /// `VARIADIC name type[]`: any number of arguments, at least one.
    pub variadic: bool,
    /// A cost that may be 0 (the peeks, where 0 reads what is left).
    pub zero_allowed: bool,
    /// How the argument is checked: the rule the native library applies through `args`
    /// and the SQL edition through the helper [`Rule::edition_helper`] names.
    pub rule: Rule,
}

/// The rule an argument is checked by. The SQL edition's bodies that say `@ARGUMENTS@`
/// get one line per ruled parameter, in the parameters' order (`sql_edition::arguments`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Checked by the function's own code (JSON, integers, leases).
    Unchecked,
    /// `args::key`: a name that is no policy key.
    Key,
    /// `args::name`: non-empty text of at most MAX_KEY_BYTES bytes.
    Name,
    /// `args::token_number`: a bucket's number, above 0 and at most MAX_TOKENS.
    Tokens,
    /// The same, or 0 (a peek).
    PeekTokens,
    /// `args::amount_micros`: an exact amount in millionths.
    Amount,
    /// The same, or 0 (a peek).
    PeekAmount,
    /// `args::duration_ms`: seconds above 0, at most a year, kept to the millisecond.
    Duration,
    /// `args::period`: 'hour', 'day', 'week', 'month' or 'year'.
    Period,
    /// The explicit clock, or the real one.
    Now,
}

impl Rule {
    /// The edition's helper for the rule, the type it returns, and whether it is given the
    /// argument's name (for its errors); None for [`Rule::Unchecked`].
    pub fn edition_helper(self) -> Option<(&'static str, &'static str, bool)> {
        Some(match self {
            Rule::Unchecked => return None,
            Rule::Key => ("rl__key", "text", false),
            Rule::Name => ("rl__name", "text", true),
            Rule::Tokens => ("rl__tokens", "double precision", true),
            Rule::PeekTokens => ("rl__peek_tokens", "double precision", true),
            Rule::Amount => ("rl__micros_of", "bigint", true),
            Rule::PeekAmount => ("rl__peek_micros", "bigint", true),
            Rule::Duration => ("rl__duration_ms", "bigint", true),
            Rule::Period => ("rl__period", "text", false),
            Rule::Now => ("rl__now", "bigint", false),
        })
    }
}

impl Param {
    /// The name as PostgreSQL writes it: quoted when it is a reserved word.
    pub fn pg_name(&self) -> String {
        if self.name == "limit" {
            format!("\"{}\"", self.name)
        } else {
            self.name.to_owned()
        }
    }
}

const fn required(name: &'static str, sql_type: SqlType) -> Param {
    Param { name, sql_type, default: None, variadic: false, zero_allowed: false, rule: Rule::Unchecked }
}

const fn optional(name: &'static str, sql_type: SqlType, default: &'static str) -> Param {
    Param { name, sql_type, default: Some(default), variadic: false, zero_allowed: false, rule: Rule::Unchecked }
}

/// How a function is run, which decides how each engine declares it.
#[derive(Clone, Copy)]
pub enum Entry {
    /// Reads or writes state. PostgreSQL: VOLATILE, PARALLEL UNSAFE, SECURITY DEFINER,
    /// EXECUTE for PUBLIC. SQLite: DIRECTONLY (never from views, triggers or schema).
    State(StateCall),
    /// Depends on its arguments only. PostgreSQL: IMMUTABLE, PARALLEL SAFE. SQLite:
    /// DETERMINISTIC, INNOCUOUS.
    Pure(PureCall),
    /// Called by the extension's own statements only, and failing anywhere else.
    /// PostgreSQL: in schema `ratelimit`, VOLATILE, no EXECUTE for PUBLIC. SQLite:
    /// DIRECTONLY, not deterministic (evaluated for each row, in order).
    Internal(InternalCall),
    /// About this process's (PostgreSQL preloaded: the server's) counters, not the
    /// database. PostgreSQL: VOLATILE, PARALLEL SAFE. SQLite: not deterministic;
    /// INNOCUOUS when it only reads (views may call it), DIRECTONLY when it changes them.
    Process(ProcessCall),
    /// About the PostgreSQL server itself (its shared memory, its build), answered by its
    /// glue. PostgreSQL: VOLATILE, EXECUTE for PUBLIC unless `admin_only`. SQLite has no
    /// server and does not register it; the SQL edition has no library to answer it.
    Server(ServerCall),
}

/// The functions about the PostgreSQL server itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCall {
    MemoryStats,
    SelfTest,
}

/// The functions that read or write state, each run over a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateCall {
    Take,
    TakeCompact,
    Spend,
    Budget,
    Sweep,
    Peek,
    Refund,
    RefundBudget,
    Reset,
    TakeAll,
    TakeAllCompact,
    RefundAll,
    ChargeAll,
    CheckLimits,
    Window,
    WindowPeek,
    FixedWindow,
    FixedWindowPeek,
    Acquire,
    Release,
    Renew,
    InFlight,
    Charge,
    ChargeBudget,
    PolicySet,
    PolicyDrop,
    Check,
    CheckCompact,
    RefundCheck,
    ChargeCheck,
    PeekCheck,
    Penalize,
    Block,
    Unblock,
    BudgetsNear,
    Usage,
    UsageAll,
    UsageRetention,
}

impl StateCall {
    /// Whether the call reads or writes buckets (and so needs the memory store when
    /// buckets live there).
    pub fn touches_buckets(self) -> bool {
        matches!(
            self,
            StateCall::Take
                | StateCall::TakeCompact
                | StateCall::TakeAllCompact
                | StateCall::CheckCompact
                | StateCall::Peek
                | StateCall::Refund
                | StateCall::Charge
                | StateCall::Sweep
                | StateCall::Reset
                | StateCall::TakeAll
                | StateCall::RefundAll
                | StateCall::ChargeAll
                | StateCall::CheckLimits
                | StateCall::Check
                | StateCall::RefundCheck
                | StateCall::ChargeCheck
                | StateCall::PeekCheck
        )
    }
}

/// The functions of their arguments alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PureCall {
    Key,
    Version,
    Headers,
    PolicyValidate,
}

/// The internal functions of the guarded UPDATEs: their WHERE guards and SET values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InternalCall {
    BucketGuard,
    BucketNewLevel,
    BucketNewRefilledAt,
    BucketNewFullAt,
    BudgetGuard,
    BudgetNewUsed,
    BudgetNewResetsAt,
    BudgetNewQuota,
}

/// The functions about this process's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessCall {
    PolicyStats,
    StatsReset,
    TopRefused,
}

#[derive(Clone, Copy)]
pub struct Function {
    pub name: &'static str,
    pub entry: Entry,
    pub params: &'static [Param],
    pub returns: SqlType,
    /// The `COMMENT ON FUNCTION` text.
    pub comment: &'static str,
    /// The keys of the JSON object it returns, in order; empty when the result is not an
    /// object with fixed keys.
    pub result_keys: &'static [&'static str],
    /// PostgreSQL: EXECUTE for members of `rl_admin` (and the owner) only, not PUBLIC:
    /// what an application role, or a query injected into it, must not do to its limits.
    pub admin_only: bool,
}

impl Function {
    /// Checks the number of arguments against the parameters (defaults may be left out).
    pub fn check_arity(&self, got: usize) -> Result<()> {
        if self.params.iter().any(|p| p.variadic) {
            return Ok(()); // the function counts its parts itself
        }
        let required = self.params.iter().filter(|p| p.default.is_none()).count();
        crate::args::arity(got, required, self.params.len())
    }

    /// The identity signature PostgreSQL uses in `COMMENT ON` and `REVOKE`:
    /// `rl_take(text, double precision, ...)`, schema-qualified for internal functions.
    pub fn pg_signature(&self) -> String {
        let types: Vec<String> = self
            .params
            .iter()
            .map(|p| if p.variadic { format!("{}[]", p.sql_type.pg_name()) } else { p.sql_type.pg_name().to_owned() })
            .collect();
        format!("{}{}({})", self.pg_schema_prefix(), self.name, types.join(", "))
    }

    /// What `pg_get_function_arguments` shows for it.
    pub fn pg_arguments(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| {
                let t = p.sql_type.pg_name();
                match (p.variadic, p.default) {
                    (true, _) => format!("VARIADIC {} {t}[]", p.name),
                    (false, None) => format!("{} {t}", p.pg_name()),
                    (false, Some("NULL")) => format!("{} {t} DEFAULT NULL::{t}", p.pg_name()),
                    (false, Some(d)) => format!("{} {t} DEFAULT {d}", p.pg_name()),
                }
            })
            .collect();
        params.join(", ")
    }

    pub fn pg_schema_prefix(&self) -> &'static str {
        if self.is_internal() {
            "ratelimit."
        } else {
            ""
        }
    }

    /// Whether it is the compact answer of a hot call (`rl_take_compact` and its kin):
    /// the JSON call's work, answered as `headers::compact` writes it.
    pub fn compact(&self) -> bool {
        matches!(self.entry, Entry::State(StateCall::TakeCompact | StateCall::CheckCompact | StateCall::TakeAllCompact))
    }

    pub fn is_internal(&self) -> bool {
        matches!(self.entry, Entry::Internal(_))
    }

    /// PostgreSQL's volatility for it (`IMMUTABLE` or `VOLATILE`), in both editions.
    pub fn volatility(&self) -> &'static str {
        match self.entry {
            Entry::Pure(_) => "IMMUTABLE",
            _ => "VOLATILE",
        }
    }

    /// PostgreSQL's parallel label for it, in both editions, from what it does: state is
    /// read and written by the leader alone (UNSAFE); the counters of this process are the
    /// leader's (a worker has its own, empty, and may not change settings: rl_policy_stats
    /// RESTRICTED, rl_stats_reset UNSAFE); pure functions and the server's shared memory
    /// read the same anywhere (SAFE).
    pub fn parallel(&self) -> &'static str {
        match self.entry {
            Entry::Pure(_) | Entry::Server(ServerCall::MemoryStats) => "SAFE",
            // its checks read the catalog through SPI: the leader's
            Entry::Process(ProcessCall::PolicyStats | ProcessCall::TopRefused)
            | Entry::Server(ServerCall::SelfTest) => "RESTRICTED",
            Entry::Process(ProcessCall::StatsReset) | Entry::State(_) | Entry::Internal(_) => "UNSAFE",
        }
    }
}

const fn ruled(param: Param, rule: Rule) -> Param {
    Param { rule, ..param }
}
const KEY: Param = ruled(required("key", SqlType::Text), Rule::Key);
const BURST: Param = ruled(required("burst", SqlType::Float8), Rule::Tokens);
const REFILL: Param = ruled(required("refill_per_minute", SqlType::Float8), Rule::Tokens);
const PERIOD: Param = ruled(required("period", SqlType::Text), Rule::Period);
const QUOTA: Param = ruled(required("quota", SqlType::Float8), Rule::Amount);
/// A bucket's tokens given back or charged.
const AMOUNT: Param = ruled(required("amount", SqlType::Float8), Rule::Tokens);
/// A budget's amount given back or charged.
const BUDGET_AMOUNT: Param = ruled(AMOUNT, Rule::Amount);
/// A bucket's cost.
const COST: Param = ruled(optional("cost", SqlType::Float8, "1"), Rule::Tokens);
const PEEK_COST: Param = Param { zero_allowed: true, rule: Rule::PeekTokens, ..COST };
/// A budget's or a window's cost (an exact amount).
const AMOUNT_COST: Param = ruled(COST, Rule::Amount);
const PEEK_AMOUNT_COST: Param = Param { zero_allowed: true, rule: Rule::PeekAmount, ..COST };
const NOW_MS: Param = ruled(optional("now_ms", SqlType::Float8, "NULL"), Rule::Now);
const TAKE_ARGS: &[Param] = &[KEY, BURST, REFILL, COST, NOW_MS];
const PEEK_ARGS: &[Param] = &[KEY, BURST, REFILL, PEEK_COST, NOW_MS];
const WINDOW_LIMIT: Param = ruled(required("limit", SqlType::Float8), Rule::Amount);
const WINDOW_SECONDS: Param = ruled(required("window_seconds", SqlType::Float8), Rule::Duration);
const WINDOW_ARGS: &[Param] = &[KEY, WINDOW_LIMIT, WINDOW_SECONDS, AMOUNT_COST, NOW_MS];
const WINDOW_PEEK_ARGS: &[Param] = &[KEY, WINDOW_LIMIT, WINDOW_SECONDS, PEEK_AMOUNT_COST, NOW_MS];
const LEASE: Param = required("lease", SqlType::Text);
const SUBJECT: Param = ruled(required("subject", SqlType::Text), Rule::Name);
const POLICY_NAME: Param = ruled(required("name", SqlType::Text), Rule::Name);
const POLICY: Param = ruled(required("policy", SqlType::Text), Rule::Name);
const BLOCK_KEYS: &[&str] = &["strikes", "blocked", "blocked_until", "retry_after_seconds"];
const LEASE_SECONDS: Param = ruled(required("lease_seconds", SqlType::Float8), Rule::Duration);
const SPEND_ARGS: &[Param] = &[KEY, PERIOD, QUOTA, AMOUNT_COST, NOW_MS];
const BUDGET_ARGS: &[Param] = &[KEY, PERIOD, QUOTA, PEEK_AMOUNT_COST, NOW_MS];

/// What rl_take and rl_window answer alike; each adds the rate it was given as a time.
const ADMISSION_KEYS: [&str; 7] =
    ["admitted", "remaining", "limit", "retry_after_ms", "retry_after_seconds", "reset_after_seconds", "exceeds_limit"];
const TAKE_KEYS: &[&str] = &admission_keys_and("refill_seconds");
const SPEND_KEYS: &[&str] = &[
    "admitted",
    "used",
    "limit",
    "remaining",
    "resets_at",
    "retry_after_seconds",
    "reset_after_seconds",
    "exceeds_limit",
    "period_seconds",
];
const WINDOW_KEYS: &[&str] = &admission_keys_and("window_seconds");

const fn admission_keys_and(last: &'static str) -> [&'static str; 8] {
    let mut keys = [last; 8];
    let mut i = 0;
    while i < ADMISSION_KEYS.len() {
        keys[i] = ADMISSION_KEYS[i];
        i += 1;
    }
    keys
}
const NOT_AN_OBJECT: &[&str] = &[];

/// The compact answers' comments: the same call as the JSON one, answered as
/// `headers::compact` writes it.
macro_rules! compact_comment {
    ($call:literal) => {
        concat!("the same call as ", $call, ", answered as text of five numbers for callers that need only the decision and the headers: 'admitted limit remaining reset retry_after', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives ", $call, "'s answer (0 where it gives none); no JSON is built or printed")
    };
}
const COMPACT_TAKE: &str = compact_comment!("rl_take");
const COMPACT_TAKE_ALL: &str = compact_comment!("rl_take_all");
const COMPACT_CHECK: &str = compact_comment!("rl_check");

use SqlType::{Bool, Float8, Int8, Jsonb, Text};

const fn function(
    name: &'static str,
    entry: Entry,
    params: &'static [Param],
    returns: SqlType,
    result_keys: &'static [&'static str],
    comment: &'static str,
) -> Function {
    Function { name, entry, params, returns, comment, result_keys, admin_only: false }
}

const fn state(name: &'static str, call: StateCall, params: &'static [Param], comment: &'static str) -> Function {
    function(name, Entry::State(call), params, Jsonb, NOT_AN_OBJECT, comment)
}

#[rustfmt::skip]
mod table {
    use super::*;

    pub const RL_TAKE: Function = Function { result_keys: TAKE_KEYS, ..state("rl_take", StateCall::Take, TAKE_ARGS,
        "token bucket: take cost tokens (all or nothing) from key; burst tokens at most, refilled per minute; returns jsonb") };
    pub const RL_TAKE_COMPACT: Function = Function { returns: Text, ..state("rl_take_compact", StateCall::TakeCompact, TAKE_ARGS,
        COMPACT_TAKE) };
    pub const RL_SPEND: Function = Function { result_keys: SPEND_KEYS, ..state("rl_spend", StateCall::Spend, SPEND_ARGS,
        "calendar budget (an hour, day, ISO week from Monday, month or year, in UTC unless the period names an anchor and a time zone, as 'month from 15 09:00 in Europe/Paris'): spend cost (all or nothing) against quota; returns jsonb") };
    pub const RL_BUDGET: Function = Function { result_keys: SPEND_KEYS, ..state("rl_budget", StateCall::Budget, BUDGET_ARGS,
        "what rl_spend with the same arguments would return, spending nothing") };
    pub const RL_SWEEP: Function = Function { returns: Int8, ..state("rl_sweep", StateCall::Sweep,
        &[NOW_MS, optional("max_rows", Int8, "NULL")],
        "delete buckets that are full again and budgets whose period ended, at most max_rows per call; returns the number of rows removed") };
    pub const RL_KEY: Function = function("rl_key", Entry::Pure(PureCall::Key),
        &[Param { variadic: true, ..required("parts", Text) }], Text, NOT_AN_OBJECT,
        "composite key: the parts JSON-encoded as an array of strings, so different part lists never collide");
    pub const RL_PEEK: Function = Function { result_keys: TAKE_KEYS, ..state("rl_peek", StateCall::Peek, PEEK_ARGS,
        "what rl_take with the same arguments would return, taking nothing") };
    pub const RL_REFUND: Function = Function { result_keys: &["remaining", "limit", "reset_after_seconds"],
        ..state("rl_refund", StateCall::Refund, &[KEY, BURST, REFILL, AMOUNT, NOW_MS],
        "give amount tokens back to a bucket, never above burst; returns the new state as jsonb") };
    pub const RL_REFUND_BUDGET: Function = Function { result_keys: &["used", "resets_at"],
        ..state("rl_refund_budget", StateCall::RefundBudget, &[KEY, PERIOD, BUDGET_AMOUNT, NOW_MS],
        "lower the current period's used by amount, never below 0; returns the new state as jsonb") };
    pub const RL_RESET: Function = Function { returns: Int8, admin_only: true, ..state("rl_reset", StateCall::Reset, &[KEY],
        "forget every bucket and budget under key; returns the number of rows removed") };
    pub const RL_TAKE_ALL: Function = Function { result_keys: &["admitted", "retry_after_ms", "retry_after_seconds", "items"],
        ..state("rl_take_all", StateCall::TakeAll, &[required("limits", Jsonb), NOW_MS],
        "take from several buckets and budgets at once, all or nothing, locking rows in a fixed order; returns jsonb") };
    pub const RL_TAKE_ALL_COMPACT: Function = Function { returns: Text,
        ..state("rl_take_all_compact", StateCall::TakeAllCompact, &[required("limits", Jsonb), NOW_MS], COMPACT_TAKE_ALL) };
    pub const RL_REFUND_ALL: Function = Function { result_keys: &["items"],
        ..state("rl_refund_all", StateCall::RefundAll, &[required("limits", Jsonb), NOW_MS],
        "give each limit of an rl_take_all list its cost back, in one unit (after an admitted rl_take_all whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb") };
    pub const RL_CHARGE_ALL: Function = Function { result_keys: &["admitted", "retry_after_ms", "retry_after_seconds", "items"],
        ..state("rl_charge_all", StateCall::ChargeAll, &[required("limits", Jsonb), NOW_MS],
        "charge each limit of an rl_take_all list its cost whatever it holds (a cost known after the work), in one unit: buckets into debt, budgets past their quota, windows past their limit; returns jsonb (remaining below 0 where a limit went past)") };
    pub const RL_CHECK_LIMITS: Function = Function { result_keys: &["admitted", "retry_after_ms", "retry_after_seconds", "items"],
        ..state("rl_check_limits", StateCall::CheckLimits,
        &[ruled(required("name", Text), Rule::Name), SUBJECT, required("limits", Jsonb), NOW_MS],
        "rl_take_all of explicit limits, counted as rl_check counts a policy: the outcome under name in rl_policy_stats, a refused subject in rl_top_refused(name) (a route's name, the web packages' way to show routes without a policy to operators); returns rl_take_all's jsonb") };
    pub const RL_WINDOW: Function = Function { result_keys: WINDOW_KEYS, ..state("rl_window", StateCall::Window, WINDOW_ARGS,
        "exact sliding window: admit cost (all or nothing) when the units admitted under key in the last window_seconds plus cost are at most limit; returns jsonb") };
    pub const RL_WINDOW_PEEK: Function = Function { result_keys: WINDOW_KEYS, ..state("rl_window_peek", StateCall::WindowPeek, WINDOW_PEEK_ARGS,
        "what rl_window with the same arguments would return, recording nothing") };
    pub const RL_FIXED_WINDOW: Function = Function { result_keys: WINDOW_KEYS, ..state("rl_fixed_window", StateCall::FixedWindow, WINDOW_ARGS,
        "fixed window: admit cost (all or nothing) when the units admitted under key in the current window (window_seconds long, aligned to the Unix epoch, counted anew at each window's start) plus cost are at most limit; returns jsonb") };
    pub const RL_FIXED_WINDOW_PEEK: Function = Function { result_keys: WINDOW_KEYS, ..state("rl_fixed_window_peek", StateCall::FixedWindowPeek, WINDOW_PEEK_ARGS,
        "what rl_fixed_window with the same arguments would return, recording nothing") };
    pub const RL_ACQUIRE: Function = Function {
        result_keys: &["admitted", "lease", "in_flight", "limit", "expires_at", "retry_after_ms", "retry_after_seconds"],
        ..state("rl_acquire", StateCall::Acquire, &[KEY, required("max_in_flight", Int8), LEASE_SECONDS, NOW_MS],
        "concurrency cap: hold a lease on key if fewer than max_in_flight unexpired leases are held; it counts until rl_release or until lease_seconds pass; returns jsonb") };
    pub const RL_RELEASE: Function = Function { returns: Bool, ..state("rl_release", StateCall::Release, &[KEY, LEASE, NOW_MS],
        "give back a lease of rl_acquire: true once, false for a lease expired, released already or never held") };
    pub const RL_RENEW: Function = Function { result_keys: &["renewed", "expires_at"],
        ..state("rl_renew", StateCall::Renew, &[KEY, LEASE, LEASE_SECONDS, NOW_MS],
        "make a held lease expire lease_seconds from now; returns jsonb (renewed false for a lease no longer held)") };
    pub const RL_IN_FLIGHT: Function = Function { returns: Int8, ..state("rl_in_flight", StateCall::InFlight, &[KEY, NOW_MS],
        "the unexpired leases held on key") };
    pub const RL_CHARGE: Function = Function { result_keys: TAKE_KEYS,
        ..state("rl_charge", StateCall::Charge, &[KEY, BURST, REFILL, AMOUNT, NOW_MS],
        "take amount tokens from a bucket whatever its level, into debt if need be (a cost known after the work); returns jsonb") };
    pub const RL_CHARGE_BUDGET: Function = Function { result_keys: &["admitted", "used", "resets_at"],
        ..state("rl_charge_budget", StateCall::ChargeBudget, &[KEY, PERIOD, BUDGET_AMOUNT, NOW_MS],
        "add amount to the current period of a budget, past its quota if need be (a cost known after the work); returns jsonb") };
    pub const RL_POLICY_SET: Function = Function { admin_only: true,
        ..state("rl_policy_set", StateCall::PolicySet, &[POLICY_NAME, required("definition", Jsonb)],
        "insert or replace a policy: limits (buckets, budgets, windows), tiers (name to multiplier) and shadow, validated whole; returns the stored definition (rl_admin only)") };
    pub const RL_POLICY_VALIDATE: Function = function("rl_policy_validate", Entry::Pure(PureCall::PolicyValidate),
        &[required("definition", Jsonb)], Jsonb, &["limits", "tiers", "shadow"],
        "validate a policy definition as rl_policy_set does, storing nothing: the same errors, naming the field; returns the definition with every field");
    pub const RL_POLICY_DROP: Function = Function { returns: Bool, admin_only: true,
        ..state("rl_policy_drop", StateCall::PolicyDrop, &[POLICY_NAME],
        "delete a policy; returns whether it existed (rl_admin only)") };
    pub const RL_CHECK: Function = Function {
        result_keys: &["admitted", "retry_after_ms", "retry_after_seconds", "items", "policy", "tier", "shadow", "would_refuse", "blocked"],
        ..state("rl_check", StateCall::Check,
        &[POLICY, SUBJECT, AMOUNT_COST, optional("tier", Text, "NULL"), NOW_MS],
        "apply every limit of a policy to subject, all or nothing, scaled by the tier's multiplier; returns jsonb") };
    pub const RL_CHECK_COMPACT: Function = Function { returns: Text,
        ..state("rl_check_compact", StateCall::CheckCompact,
        &[POLICY, SUBJECT, AMOUNT_COST, optional("tier", Text, "NULL"), NOW_MS], COMPACT_CHECK) };
    pub const RL_REFUND_CHECK: Function = Function { result_keys: &["policy", "tier", "items"],
        ..state("rl_refund_check", StateCall::RefundCheck,
        &[POLICY, SUBJECT, AMOUNT_COST, optional("tier", Text, "NULL"), NOW_MS],
        "give cost back to every limit of a policy for subject, scaled by the tier (after an admitted rl_check whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb") };
    pub const RL_CHARGE_CHECK: Function = Function {
        result_keys: &["admitted", "retry_after_ms", "retry_after_seconds", "items", "policy", "tier"],
        ..state("rl_charge_check", StateCall::ChargeCheck,
        &[POLICY, SUBJECT, ruled(required("amount", Float8), Rule::Amount), optional("tier", Text, "NULL"), NOW_MS],
        "charge amount to every limit of a policy for subject, scaled by the tier, whatever they hold (a cost known after the work): buckets into debt, budgets past their quota, windows past their limit; returns jsonb") };
    pub const RL_PEEK_CHECK: Function = Function {
        result_keys: &["admitted", "retry_after_ms", "retry_after_seconds", "items", "policy", "tier", "shadow", "would_refuse", "blocked"],
        ..state("rl_peek_check", StateCall::PeekCheck,
        &[POLICY, SUBJECT, PEEK_AMOUNT_COST, optional("tier", Text, "NULL"), NOW_MS],
        "what rl_check with the same arguments would return, charging and counting nothing (cost 0 reads what is left)") };
    pub const RL_PENALIZE: Function = Function { result_keys: BLOCK_KEYS,
        ..state("rl_penalize", StateCall::Penalize,
        &[SUBJECT, optional("free_strikes", Int8, "3"), optional("base_seconds", Float8, "60"),
          optional("max_seconds", Float8, "3600"), optional("window_seconds", Float8, "3600"), NOW_MS],
        "record a strike against subject; past free_strikes it is blocked for min(base_seconds * 2^(strikes - free_strikes), max_seconds); strikes are forgotten window_seconds after the last, never sooner than an earlier strike's window said; returns jsonb") };
    pub const RL_BLOCK: Function = Function { result_keys: BLOCK_KEYS,
        ..state("rl_block", StateCall::Block, &[SUBJECT, required("seconds", Float8), NOW_MS],
        "block subject for seconds (NULL: until rl_unblock), never shortening a block in force: rl_check refuses it for every enforced policy; returns jsonb") };
    pub const RL_UNBLOCK: Function = Function { returns: Bool, admin_only: true,
        ..state("rl_unblock", StateCall::Unblock, &[SUBJECT, NOW_MS],
        "lift the block on subject and forget its strikes; returns whether it was blocked (rl_admin only)") };
    pub const RL_POLICY_STATS: Function = Function { admin_only: true,
        ..function("rl_policy_stats", Entry::Process(ProcessCall::PolicyStats), &[], Jsonb, NOT_AN_OBJECT,
        "counts of rl_check per policy (admitted, refused, would_refuse in shadow mode, refused_blocked), and of rl_check_limits per name, since the last reset, and their scope: server (PostgreSQL, preloaded), session (PostgreSQL, not preloaded) or process (SQLite); the view rl_stats lists them (rl_admin only)") };
    pub const RL_STATS_RESET: Function = Function { admin_only: true,
        ..function("rl_stats_reset", Entry::Process(ProcessCall::StatsReset), &[], Int8, NOT_AN_OBJECT,
        "forget the counts of rl_policy_stats and the subjects of rl_top_refused; returns how many policies had counts (rl_admin only)") };
    pub const RL_TOP_REFUSED: Function = Function { result_keys: &["policy", "scope", "subjects"], admin_only: true,
        ..function("rl_top_refused", Entry::Process(ProcessCall::TopRefused), &[POLICY, optional("n", Int8, "10")], Jsonb, NOT_AN_OBJECT,
        "the n (1 to 64) subjects rl_check refused most under policy (or rl_check_limits under that name) since rl_stats_reset, most first: subject, refusals (at most error more than the true count), error, last_refused_ms; from a summary of 64 subjects per policy, with the scope of rl_policy_stats; the view rl_refused lists every policy's (rl_admin only)") };
    pub const RL_BUDGETS_NEAR: Function = Function { result_keys: &["fraction", "budgets"], admin_only: true,
        ..state("rl_budgets_near", StateCall::BudgetsNear,
        &[required("fraction", Float8), optional("n", Int8, "100"), NOW_MS],
        "the budgets of the current period that used at least fraction of their quota (the quota the last rl_spend, rl_take_all or rl_check gave), the largest share first, at most n (1 to 10000): key, period, used, quota, resets_at; a scan of every budget row (rl_admin only)") };
    pub const RL_USAGE: Function = Function { result_keys: &["key", "from_ms", "to_ms", "periods"],
        ..state("rl_usage", StateCall::Usage,
        &[KEY, required("from_ms", Float8), required("to_ms", Float8)],
        "the ended periods of key's budgets, kept for invoicing, that ended after from_ms and by to_ms (epoch ms), by end then period: period, starts_at, ends_at (epoch seconds), used and quota (the last spend's) in exact decimals; kept 400 days, then rl_sweep removes them; at most 10000 periods") };
    pub const RL_USAGE_ALL: Function = Function { result_keys: &["from_ms", "to_ms", "periods", "next"], admin_only: true,
        ..state("rl_usage_all", StateCall::UsageAll,
        &[required("from_ms", Float8), required("to_ms", Float8), optional("after", Jsonb, "NULL"), optional("n", Int8, "1000")],
        "every key's ended budget periods kept for invoicing that ended after from_ms and by to_ms (epoch ms), a page of at most n (1 to 10000) by end, then key, then period (in byte order): key, period, starts_at, ends_at (epoch seconds), used and quota in exact decimals; next is where the page stopped, to pass as after for the next page, or null after the last (rl_admin only)") };
    pub const RL_USAGE_RETENTION: Function = Function { returns: Int8, admin_only: true,
        ..state("rl_usage_retention", StateCall::UsageRetention, &[optional("days", Int8, "NULL")],
        "how many days rl_sweep keeps ended budget periods (rl_usage) after they end: with days (1 to 36500), set it first; returns the retention in force (default 400; rl_admin only)") };
    pub const RL_VERSION: Function = function("rl_version", Entry::Pure(PureCall::Version), &[], Text, NOT_AN_OBJECT,
        "the version of the library answering (in PostgreSQL, compare the extension version in pg_extension)");
    pub const RL_MEMORY_STATS: Function = Function {
        result_keys: &["capacity", "in_use", "evicted_full", "evicted_early", "saved", "loaded", "bytes_per_bucket"],
        ..function("rl_memory_stats", Entry::Server(ServerCall::MemoryStats), &[], Jsonb, NOT_AN_OBJECT,
        "the memory store (pg_ratelimit.buckets = memory): buckets it can hold and holds, new keys that replaced a bucket full again or early, buckets saved at the last clean shutdown and loaded at start; returns jsonb") };
    pub const RL_SELF_TEST: Function = Function { result_keys: &["checks", "failed"], admin_only: true,
        ..function("rl_self_test", Entry::Server(ServerCall::SelfTest), &[], Jsonb, NOT_AN_OBJECT,
        "checks this build of the library against this server: each answer it lays out in jsonb is byte for byte what the server's jsonb_in makes of its text, and each function's catalog entry is what the library's table says; returns the number of checks and the failures (rl_admin only)") };
    pub const RL_HEADERS: Function = function("rl_headers", Entry::Pure(PureCall::Headers),
        &[required("result", Jsonb)], Jsonb, NOT_AN_OBJECT,
        "HTTP headers (RateLimit-Policy, RateLimit, X-RateLimit-*, Retry-After) for any rl_* result");

    // The internal functions of the guarded UPDATEs (sql/statements/bucket_change.sql,
    // sql/statements/budget_change.sql; see crate::decision_slot).
    pub const RL_BUCKET_GUARD: Function = function("rl_bucket_guard", Entry::Internal(InternalCall::BucketGuard),
        &[required("level", Float8), required("refilled_at", Int8), required("full_at", Int8)], Bool, NOT_AN_OBJECT,
        "internal: hands a bucket row to the decision of the rl_* call in progress; true when it writes");
    pub const RL_BUCKET_NEW_LEVEL: Function = function("rl_bucket_new_level",
        Entry::Internal(InternalCall::BucketNewLevel), &[], Float8, NOT_AN_OBJECT,
        "internal: the level the call in progress writes");
    pub const RL_BUCKET_NEW_REFILLED_AT: Function = function("rl_bucket_new_refilled_at",
        Entry::Internal(InternalCall::BucketNewRefilledAt), &[], Int8, NOT_AN_OBJECT,
        "internal: the refilled_at the call in progress writes");
    pub const RL_BUCKET_NEW_FULL_AT: Function = function("rl_bucket_new_full_at",
        Entry::Internal(InternalCall::BucketNewFullAt), &[], Int8, NOT_AN_OBJECT,
        "internal: the full_at the call in progress writes");
    pub const RL_BUDGET_GUARD: Function = function("rl_budget_guard", Entry::Internal(InternalCall::BudgetGuard),
        &[required("used", Int8), required("resets_at", Int8), required("quota", Int8)], Bool, NOT_AN_OBJECT,
        "internal: hands a budget row to the decision of the rl_* call in progress; true when it writes");
    pub const RL_BUDGET_NEW_USED: Function = function("rl_budget_new_used",
        Entry::Internal(InternalCall::BudgetNewUsed), &[], Int8, NOT_AN_OBJECT,
        "internal: the used the call in progress writes");
    pub const RL_BUDGET_NEW_RESETS_AT: Function = function("rl_budget_new_resets_at",
        Entry::Internal(InternalCall::BudgetNewResetsAt), &[], Int8, NOT_AN_OBJECT,
        "internal: the resets_at the call in progress writes");
    pub const RL_BUDGET_NEW_QUOTA: Function = function("rl_budget_new_quota",
        Entry::Internal(InternalCall::BudgetNewQuota), &[], Int8, NOT_AN_OBJECT,
        "internal: the quota the call in progress writes");
}

pub use table::*;

/// Every function, public ones first, in the order the reference documents them.
pub const ALL: &[Function] = &[
    RL_TAKE,
    RL_TAKE_COMPACT,
    RL_SPEND,
    RL_BUDGET,
    RL_SWEEP,
    RL_KEY,
    RL_PEEK,
    RL_REFUND,
    RL_REFUND_BUDGET,
    RL_RESET,
    RL_TAKE_ALL,
    RL_TAKE_ALL_COMPACT,
    RL_REFUND_ALL,
    RL_CHARGE_ALL,
    RL_CHECK_LIMITS,
    RL_WINDOW,
    RL_WINDOW_PEEK,
    RL_FIXED_WINDOW,
    RL_FIXED_WINDOW_PEEK,
    RL_ACQUIRE,
    RL_RELEASE,
    RL_RENEW,
    RL_IN_FLIGHT,
    RL_CHARGE,
    RL_CHARGE_BUDGET,
    RL_POLICY_SET,
    RL_POLICY_VALIDATE,
    RL_POLICY_DROP,
    RL_CHECK,
    RL_CHECK_COMPACT,
    RL_REFUND_CHECK,
    RL_CHARGE_CHECK,
    RL_PEEK_CHECK,
    RL_PENALIZE,
    RL_BLOCK,
    RL_UNBLOCK,
    RL_POLICY_STATS,
    RL_STATS_RESET,
    RL_TOP_REFUSED,
    RL_BUDGETS_NEAR,
    RL_USAGE,
    RL_USAGE_ALL,
    RL_USAGE_RETENTION,
    RL_HEADERS,
    RL_VERSION,
    RL_MEMORY_STATS,
    RL_SELF_TEST,
    RL_BUCKET_GUARD,
    RL_BUCKET_NEW_LEVEL,
    RL_BUCKET_NEW_REFILLED_AT,
    RL_BUCKET_NEW_FULL_AT,
    RL_BUDGET_GUARD,
    RL_BUDGET_NEW_USED,
    RL_BUDGET_NEW_RESETS_AT,
    RL_BUDGET_NEW_QUOTA,
];

/// The function called `name`.
pub fn by_name(name: &str) -> Option<&'static Function> {
    ALL.iter().find(|f| f.name == name)
}
