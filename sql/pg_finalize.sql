-- Generated from shared/src/functions.rs (RL_BLESS=1 cargo test -p ratelimit_core --test generated).
-- Deliberate declarations of every function's purpose.
COMMENT ON FUNCTION rl_take(text, double precision, double precision, double precision, double precision) IS
  'token bucket: take cost tokens (all or nothing) from key; burst tokens at most, refilled per minute; returns jsonb';
COMMENT ON FUNCTION rl_spend(text, text, double precision, double precision, double precision) IS
  'calendar budget (UTC day or month): spend cost (all or nothing) against quota; returns jsonb';
COMMENT ON FUNCTION rl_budget(text, text, double precision, double precision, double precision) IS
  'what rl_spend with the same arguments would return, spending nothing';
COMMENT ON FUNCTION rl_sweep(double precision, bigint) IS
  'delete buckets that are full again and budgets whose period ended, at most max_rows per call; returns the number of rows removed';
COMMENT ON FUNCTION rl_key(text[]) IS
  'composite key: the parts JSON-encoded as an array of strings, so different part lists never collide';
COMMENT ON FUNCTION rl_peek(text, double precision, double precision, double precision, double precision) IS
  'what rl_take with the same arguments would return, taking nothing';
COMMENT ON FUNCTION rl_refund(text, double precision, double precision, double precision, double precision) IS
  'give amount tokens back to a bucket, never above burst; returns the new state as jsonb';
COMMENT ON FUNCTION rl_refund_budget(text, text, double precision, double precision) IS
  'lower the current period''s used by amount, never below 0; returns the new state as jsonb';
COMMENT ON FUNCTION rl_reset(text) IS
  'forget every bucket and budget under key; returns the number of rows removed';
COMMENT ON FUNCTION rl_take_all(jsonb, double precision) IS
  'take from several buckets and budgets at once, all or nothing, locking rows in a fixed order; returns jsonb';
COMMENT ON FUNCTION rl_window(text, double precision, double precision, double precision, double precision) IS
  'exact sliding window: admit cost (all or nothing) when the units admitted under key in the last window_seconds plus cost are at most limit; returns jsonb';
COMMENT ON FUNCTION rl_window_peek(text, double precision, double precision, double precision, double precision) IS
  'what rl_window with the same arguments would return, recording nothing';
COMMENT ON FUNCTION rl_acquire(text, bigint, double precision, double precision) IS
  'concurrency cap: hold a lease on key if fewer than max_in_flight unexpired leases are held; it counts until rl_release or until lease_seconds pass; returns jsonb';
COMMENT ON FUNCTION rl_release(text, text, double precision) IS
  'give back a lease of rl_acquire: true once, false for a lease expired, released already or never held';
COMMENT ON FUNCTION rl_renew(text, text, double precision, double precision) IS
  'make a held lease expire lease_seconds from now; returns jsonb (renewed false for a lease no longer held)';
COMMENT ON FUNCTION rl_in_flight(text, double precision) IS
  'the unexpired leases held on key';
COMMENT ON FUNCTION rl_charge(text, double precision, double precision, double precision, double precision) IS
  'take amount tokens from a bucket whatever its level, into debt if need be (a cost known after the work); returns jsonb';
COMMENT ON FUNCTION rl_charge_budget(text, text, double precision, double precision) IS
  'add amount to the current period of a budget, past its quota if need be (a cost known after the work); returns jsonb';
COMMENT ON FUNCTION rl_policy_set(text, jsonb) IS
  'insert or replace a policy: limits (buckets, budgets, windows), tiers (name to multiplier) and shadow, validated whole; returns the stored definition (rl_admin only)';
COMMENT ON FUNCTION rl_policy_drop(text) IS
  'delete a policy; returns whether it existed (rl_admin only)';
COMMENT ON FUNCTION rl_check(text, text, double precision, text, double precision) IS
  'apply every limit of a policy to subject, all or nothing, scaled by the tier''s multiplier; returns jsonb';
COMMENT ON FUNCTION rl_refund_check(text, text, double precision, text, double precision) IS
  'give cost back to every limit of a policy for subject, scaled by the tier (after an admitted rl_check whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb';
COMMENT ON FUNCTION rl_penalize(text, bigint, double precision, double precision, double precision, double precision) IS
  'record a strike against subject; past free_strikes it is blocked for min(base_seconds * 2^(strikes - free_strikes), max_seconds); strikes are forgotten window_seconds after the last, never sooner than an earlier strike''s window said; returns jsonb';
COMMENT ON FUNCTION rl_block(text, double precision, double precision) IS
  'block subject for seconds (NULL: until rl_unblock), never shortening a block in force: rl_check refuses it for every enforced policy; returns jsonb';
COMMENT ON FUNCTION rl_unblock(text, double precision) IS
  'lift the block on subject and forget its strikes; returns whether it was blocked (rl_admin only)';
COMMENT ON FUNCTION rl_policy_stats() IS
  'counts of rl_check per policy (admitted, refused, would_refuse in shadow mode, refused_blocked) since the last reset, and their scope: server (PostgreSQL, preloaded), session (PostgreSQL, not preloaded) or process (SQLite); the view rl_stats lists them (rl_admin only)';
COMMENT ON FUNCTION rl_stats_reset() IS
  'forget the counts of rl_policy_stats; returns how many policies had some (rl_admin only)';
COMMENT ON FUNCTION rl_headers(jsonb) IS
  'HTTP headers (RateLimit-Policy, RateLimit, X-RateLimit-*, Retry-After) for any rl_* result';
COMMENT ON FUNCTION rl_version() IS
  'the version of the library answering (in PostgreSQL, compare the extension version in pg_extension)';
COMMENT ON FUNCTION rl_memory_stats() IS
  'the memory store (pg_ratelimit.buckets = memory): buckets it can hold and holds, new keys that replaced a bucket full again or early, buckets saved at the last clean shutdown and loaded at start; returns jsonb';

-- Administration: members of rl_admin (and the owner) only, never an application role.
REVOKE ALL ON FUNCTION
  rl_reset(text),
  rl_policy_set(text, jsonb),
  rl_policy_drop(text),
  rl_unblock(text, double precision),
  rl_policy_stats(),
  rl_stats_reset()
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  rl_reset(text),
  rl_policy_set(text, jsonb),
  rl_policy_drop(text),
  rl_unblock(text, double precision),
  rl_policy_stats(),
  rl_stats_reset()
TO rl_admin;

-- Internal: called only by the guarded UPDATEs of rl_take, rl_spend and the refunds.
REVOKE ALL ON FUNCTION
  ratelimit.rl_bucket_guard(double precision, bigint, bigint),
  ratelimit.rl_bucket_new_level(),
  ratelimit.rl_bucket_new_refilled_at(),
  ratelimit.rl_bucket_new_full_at(),
  ratelimit.rl_budget_guard(bigint, bigint),
  ratelimit.rl_budget_new_used(),
  ratelimit.rl_budget_new_resets_at()
FROM PUBLIC;
COMMENT ON FUNCTION ratelimit.rl_bucket_guard(double precision, bigint, bigint) IS
  'internal: hands a bucket row to the decision of the rl_* call in progress; true when it writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_level() IS
  'internal: the level the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_refilled_at() IS
  'internal: the refilled_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_full_at() IS
  'internal: the full_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_guard(bigint, bigint) IS
  'internal: hands a budget row to the decision of the rl_* call in progress; true when it writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_used() IS
  'internal: the used the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_resets_at() IS
  'internal: the resets_at the call in progress writes';
