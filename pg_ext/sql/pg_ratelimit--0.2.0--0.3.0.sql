-- pg_ratelimit 0.2.0 -> 0.3.0: the memory store, state that survives pg_dump, rl_version(),
-- sliding windows (rl_window, rl_window_peek), leases (rl_acquire, rl_release, rl_renew,
-- rl_in_flight), charges after the fact (rl_charge, rl_charge_budget), and policies
-- (rl_policy_set, rl_policy_drop, rl_check, the view rl_policies, the role rl_admin),
-- penalties and blocks (rl_penalize, rl_block, rl_unblock, the view rl_blocks), and
-- rl_check's counters (rl_policy_stats, rl_stats_reset, the view rl_stats).
-- pg_ratelimit.buckets = 'memory' keeps token buckets in shared memory (the library in
-- shared_preload_libraries); rl_memory_stats() reports on that table. The state tables
-- are marked for pg_dump, which left their rows out before (a restored backup had lost
-- every level and spend). Buckets and budgets in the tables are kept as they are.

-- complain if this script is run in psql rather than by ALTER EXTENSION
\echo Use "ALTER EXTENSION pg_ratelimit UPDATE TO '0.3.0'" to load this file. \quit

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

-- Policies (rl_policy_set, rl_policy_drop, rl_check) are rows of ratelimit.rl_policy,
-- listed by the view rl_policies. Only members of rl_admin (and the owner) may set or drop
-- them or reset keys: rl_reset loses PUBLIC's EXECUTE.
CREATE TABLE ratelimit.rl_policy (
    name       text NOT NULL PRIMARY KEY,
    definition text NOT NULL,
    revision   bigint NOT NULL
);
REVOKE ALL ON ratelimit.rl_policy FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_policy', '');
COMMENT ON TABLE ratelimit.rl_policy IS 'policies set by rl_policy_set: a name, its definition (canonical JSON text) and a revision drawn anew by each set';
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'rl_admin') THEN
        CREATE ROLE rl_admin NOLOGIN;
    END IF;
END
$$;
CREATE VIEW rl_policies AS
    SELECT name, definition::jsonb AS definition FROM ratelimit.rl_policy;
REVOKE ALL ON rl_policies FROM PUBLIC;
GRANT SELECT ON rl_policies TO rl_admin;
COMMENT ON VIEW rl_policies IS 'every policy and its definition (rl_policy_set, rl_policy_drop); readable by rl_admin';
REVOKE ALL ON FUNCTION rl_reset(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rl_reset(text) TO rl_admin;

CREATE FUNCTION "rl_policy_set"("name" TEXT, "definition" jsonb) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_policy_set_wrapper';
COMMENT ON FUNCTION rl_policy_set(text, jsonb) IS
  'insert or replace a policy: limits (buckets, budgets, windows), tiers (name to multiplier) and shadow, validated whole; returns the stored definition (rl_admin only)';

CREATE FUNCTION "rl_policy_drop"("name" TEXT) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_policy_drop_wrapper';
COMMENT ON FUNCTION rl_policy_drop(text) IS
  'delete a policy; returns whether it existed (rl_admin only)';

CREATE FUNCTION "rl_check"("policy" TEXT, "subject" TEXT, "cost" double precision DEFAULT 1, "tier" TEXT DEFAULT NULL, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_check_wrapper';
COMMENT ON FUNCTION rl_check(text, text, double precision, text, double precision) IS
  'apply every limit of a policy to subject, all or nothing, scaled by the tier''s multiplier; returns jsonb';

CREATE FUNCTION "rl_refund_check"("policy" TEXT, "subject" TEXT, "cost" double precision DEFAULT 1, "tier" TEXT DEFAULT NULL, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_refund_check_wrapper';
COMMENT ON FUNCTION rl_refund_check(text, text, double precision, text, double precision) IS
  'give cost back to every limit of a policy for subject, scaled by the tier (after an admitted rl_check whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb';

REVOKE ALL ON FUNCTION rl_policy_set(text, jsonb), rl_policy_drop(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rl_policy_set(text, jsonb), rl_policy_drop(text) TO rl_admin;

-- Penalties and blocks (rl_penalize, rl_block, rl_unblock): a subject's strikes are a row
-- of rl_entries (kind 'block'); the view rl_blocks lists the subjects blocked now.
-- rl_check lists the subjects with strikes or blocks (ratelimit.rl_entries rows of kind
-- 'block') without reading windows and leases; key and kind never change, so updates of
-- windows and leases stay HOT.
CREATE INDEX rl_entries_strikes ON ratelimit.rl_entries (key) WHERE kind = 'block';
COMMENT ON INDEX ratelimit.rl_entries_strikes IS 'the rows of strikes and blocks, which rl_check lists while they are few';
CREATE VIEW rl_blocks AS
    SELECT key AS subject, (entries::jsonb ->> 'strikes')::bigint AS strikes,
           CASE WHEN jsonb_typeof(entries::jsonb -> 'blocked_until') = 'number'
                THEN (entries::jsonb ->> 'blocked_until')::bigint END AS blocked_until_ms
    FROM ratelimit.rl_entries
    WHERE kind = 'block'
      AND (jsonb_typeof(entries::jsonb -> 'blocked_until') = 'null'
           OR (jsonb_typeof(entries::jsonb -> 'blocked_until') = 'number'
               AND (entries::jsonb ->> 'blocked_until')::bigint > (extract(epoch FROM clock_timestamp()) * 1000)::bigint));
REVOKE ALL ON rl_blocks FROM PUBLIC;
GRANT SELECT ON rl_blocks TO rl_admin;
COMMENT ON VIEW rl_blocks IS 'subjects blocked now (rl_penalize, rl_block): strikes, and the block''s end in epoch ms (NULL: until rl_unblock); readable by rl_admin';

CREATE FUNCTION "rl_penalize"("subject" TEXT, "free_strikes" bigint DEFAULT 3, "base_seconds" double precision DEFAULT 60, "max_seconds" double precision DEFAULT 3600, "window_seconds" double precision DEFAULT 3600, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_penalize_wrapper';
COMMENT ON FUNCTION rl_penalize(text, bigint, double precision, double precision, double precision, double precision) IS
  'record a strike against subject; past free_strikes it is blocked for min(base_seconds * 2^(strikes - free_strikes), max_seconds); strikes are forgotten window_seconds after the last, never sooner than an earlier strike''s window said; returns jsonb';

CREATE FUNCTION "rl_block"("subject" TEXT, "seconds" double precision, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_block_wrapper';
COMMENT ON FUNCTION rl_block(text, double precision, double precision) IS
  'block subject for seconds (NULL: until rl_unblock), never shortening a block in force: rl_check refuses it for every enforced policy; returns jsonb';

CREATE FUNCTION "rl_unblock"("subject" TEXT, "now_ms" double precision DEFAULT NULL) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_unblock_wrapper';
COMMENT ON FUNCTION rl_unblock(text, double precision) IS
  'lift the block on subject and forget its strikes; returns whether it was blocked (rl_admin only)';

REVOKE ALL ON FUNCTION rl_unblock(text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rl_unblock(text, double precision) TO rl_admin;

-- rl_check's counters (rl_policy_stats, rl_stats_reset, the view rl_stats).
CREATE FUNCTION "rl_policy_stats"() RETURNS jsonb
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_policy_stats_wrapper';
COMMENT ON FUNCTION rl_policy_stats() IS
  'counts of rl_check per policy (admitted, refused, would_refuse in shadow mode, refused_blocked) since the last reset, and their scope: server (PostgreSQL, preloaded), session (PostgreSQL, not preloaded) or process (SQLite); the view rl_stats lists them (rl_admin only)';

CREATE FUNCTION "rl_stats_reset"() RETURNS bigint
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_stats_reset_wrapper';
COMMENT ON FUNCTION rl_stats_reset() IS
  'forget the counts of rl_policy_stats; returns how many policies had some (rl_admin only)';

REVOKE ALL ON FUNCTION rl_policy_stats(), rl_stats_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rl_policy_stats(), rl_stats_reset() TO rl_admin;

CREATE VIEW rl_stats AS
    SELECT key AS policy, (value ->> 'admitted')::bigint AS admitted, (value ->> 'refused')::bigint AS refused,
           (value ->> 'would_refuse')::bigint AS would_refuse, (value ->> 'refused_blocked')::bigint AS refused_blocked
    FROM pg_catalog.jsonb_each(rl_policy_stats() -> 'policies');
REVOKE ALL ON rl_stats FROM PUBLIC;
GRANT SELECT ON rl_stats TO rl_admin;
COMMENT ON VIEW rl_stats IS 'rl_check counts per policy since rl_stats_reset (see rl_policy_stats for their scope); readable by rl_admin';
