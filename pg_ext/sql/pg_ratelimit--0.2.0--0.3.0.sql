-- pg_ratelimit 0.2.0 -> 0.3.0: the memory store, state that survives pg_dump, rl_version(),
-- sliding windows (rl_window, rl_window_peek), leases (rl_acquire, rl_release, rl_renew,
-- rl_in_flight) and charges after the fact (rl_charge, rl_charge_budget).
-- pg_ratelimit.buckets = 'memory' keeps token buckets in shared memory (the library in
-- shared_preload_libraries); rl_memory_stats() reports on that table. The state tables
-- are marked for pg_dump, which left their rows out before (a restored backup had lost
-- every level and spend). Buckets and budgets in the tables are kept as they are.

SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_bucket', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_budget', '');

CREATE FUNCTION "rl_memory_stats"() RETURNS jsonb
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_memory_stats_wrapper';
COMMENT ON FUNCTION rl_memory_stats() IS
  'the memory store (pg_ratelimit.buckets = memory): buckets it can hold and holds, new keys that replaced a bucket full again or early, buckets saved at the last clean shutdown and loaded at start; returns jsonb';


CREATE FUNCTION "rl_version"() RETURNS text
STRICT IMMUTABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_version_wrapper';
COMMENT ON FUNCTION rl_version() IS
  'the version of the library answering (in PostgreSQL, compare the extension version in pg_extension)';

-- Sliding windows and leases keep a list per key in ratelimit.rl_entries.
CREATE TABLE ratelimit.rl_entries (
    key      text   NOT NULL,
    kind     text   NOT NULL,
    entries  text   NOT NULL,
    empty_at bigint NOT NULL,
    PRIMARY KEY (key, kind)
);
REVOKE ALL ON ratelimit.rl_entries FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_entries', '');
COMMENT ON TABLE ratelimit.rl_entries IS 'sliding windows (kind window) and leases (kind lease): a list per key, no entry counting from empty_at (epoch ms)';

CREATE FUNCTION "rl_window"("key" TEXT, "limit" double precision, "window_seconds" double precision, "cost" double precision DEFAULT 1, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_window_wrapper';
COMMENT ON FUNCTION rl_window(text, double precision, double precision, double precision, double precision) IS
  'exact sliding window: admit cost (all or nothing) when the units admitted under key in the last window_seconds plus cost are at most limit; returns jsonb';

CREATE FUNCTION "rl_window_peek"("key" TEXT, "limit" double precision, "window_seconds" double precision, "cost" double precision DEFAULT 1, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_window_peek_wrapper';
COMMENT ON FUNCTION rl_window_peek(text, double precision, double precision, double precision, double precision) IS
  'what rl_window with the same arguments would return, recording nothing';

CREATE FUNCTION "rl_acquire"("key" TEXT, "max_in_flight" bigint, "lease_seconds" double precision, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_acquire_wrapper';
COMMENT ON FUNCTION rl_acquire(text, bigint, double precision, double precision) IS
  'concurrency cap: hold a lease on key if fewer than max_in_flight unexpired leases are held; it counts until rl_release or until lease_seconds pass; returns jsonb';

CREATE FUNCTION "rl_release"("key" TEXT, "lease" TEXT, "now_ms" double precision DEFAULT NULL) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_release_wrapper';
COMMENT ON FUNCTION rl_release(text, text, double precision) IS
  'give back a lease of rl_acquire: true once, false for a lease expired, released already or never held';

CREATE FUNCTION "rl_renew"("key" TEXT, "lease" TEXT, "lease_seconds" double precision, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_renew_wrapper';
COMMENT ON FUNCTION rl_renew(text, text, double precision, double precision) IS
  'make a held lease expire lease_seconds from now; returns jsonb (renewed false for a lease no longer held)';

CREATE FUNCTION "rl_in_flight"("key" TEXT, "now_ms" double precision DEFAULT NULL) RETURNS bigint
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_in_flight_wrapper';
COMMENT ON FUNCTION rl_in_flight(text, double precision) IS
  'the unexpired leases held on key';

CREATE FUNCTION "rl_charge"("key" TEXT, "burst" double precision, "refill_per_minute" double precision, "amount" double precision, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_charge_wrapper';
COMMENT ON FUNCTION rl_charge(text, double precision, double precision, double precision, double precision) IS
  'take amount tokens from a bucket whatever its level, into debt if need be (a cost known after the work); returns jsonb';

CREATE FUNCTION "rl_charge_budget"("key" TEXT, "period" TEXT, "amount" double precision, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_charge_budget_wrapper';
COMMENT ON FUNCTION rl_charge_budget(text, text, double precision, double precision) IS
  'add amount to the current period of a budget, past its quota if need be (a cost known after the work); returns jsonb';
