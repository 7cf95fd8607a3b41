-- pg_ratelimit 0.3.0 -> 0.4.0: every object ends with exactly the privileges the extension
-- intends, whatever ALTER DEFAULT PRIVILEGES granted when it was created (0.3.0 revoked
-- only from PUBLIC, so a platform's default grants to named roles, such as Supabase's to
-- anon, authenticated and service_role, reached the administration functions, the views
-- and the state); an application function keeps the privileges its owner gave it.
-- rl_policy_stats is PARALLEL RESTRICTED and rl_stats_reset PARALLEL UNSAFE: both are
-- about the leader's own counters. rl_self_test(): the in-server checks.
-- rl_policy_validate(definition): rl_policy_set's validation alone. A check of a policy
-- that does not exist fails with SQLSTATE 42704 (undefined_object), not 22023.
-- rl_top_refused(policy, n) and the view rl_refused: the subjects rl_check refuses most.
-- rl_budgets_near(fraction, n, now_ms): the budgets near their quota, which a budget row
-- now keeps (column quota: that of the last spend, 0 for the rows written before).
-- rl_refund_all(limits, now_ms): the inverse of rl_take_all; rl_charge_all(limits, now_ms)
-- and rl_charge_check(policy, subject, amount, tier, now_ms): costs known after the work;
-- rl_peek_check(policy, subject, cost, tier, now_ms): rl_check's answer, charging nothing.
-- rl_check_limits(name, subject, limits, now_ms): rl_take_all counted under a name as
-- rl_check counts a policy (the web packages' routes with explicit limits). Budgets take
-- the periods 'hour', 'week' (ISO, from Monday) and 'year' beside 'day' and 'month' (UTC).
-- Fixed windows: rl_fixed_window(key, limit, window_seconds, cost, now_ms) and its peek,
-- and the item and policy limit {"limit", "fixed_window_seconds"} (rows of kind
-- 'fixed_window' in rl_entries). rl_usage(key, from_ms, to_ms) and the table rl_usage: the
-- ended periods of budgets, kept 400 days for invoicing, or as long as an administrator
-- sets with rl_usage_retention(days) (the table rl_setting). Budget periods may be anchored
-- and in a time zone ('month from 31 09:00 in Europe/Paris'), stored in their canonical text.

-- complain if this script is run in psql rather than by ALTER EXTENSION
\echo Use "ALTER EXTENSION pg_ratelimit UPDATE TO '0.4.0'" to load this file. \quit

-- generated: remember (codegen/src/privileges.rs; RL_BLESS=1 cargo test -p ratelimit_codegen --test generated)
DO $rl_existing$ BEGIN
    PERFORM pg_catalog.set_config('pg_ratelimit_install.existing_functions', coalesce((
        SELECT pg_catalog.string_agg(p.oid::text, ' ') FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.current_schema()::regnamespace
          AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['rl_take', 'rl_take_compact', 'rl_spend', 'rl_budget', 'rl_sweep', 'rl_key', 'rl_peek', 'rl_refund', 'rl_refund_budget', 'rl_reset', 'rl_take_all', 'rl_take_all_compact', 'rl_refund_all', 'rl_charge_all', 'rl_check_limits', 'rl_window', 'rl_window_peek', 'rl_fixed_window', 'rl_fixed_window_peek', 'rl_acquire', 'rl_release', 'rl_renew', 'rl_in_flight', 'rl_charge', 'rl_charge_budget', 'rl_policy_set', 'rl_policy_validate', 'rl_policy_drop', 'rl_check', 'rl_check_compact', 'rl_refund_check', 'rl_charge_check', 'rl_peek_check', 'rl_penalize', 'rl_block', 'rl_unblock', 'rl_policy_stats', 'rl_stats_reset', 'rl_top_refused', 'rl_budgets_near', 'rl_usage', 'rl_usage_all', 'rl_usage_retention', 'rl_headers', 'rl_version', 'rl_memory_stats', 'rl_self_test']::name[])), ''), true);
END $rl_existing$;
-- end generated

ALTER FUNCTION rl_policy_stats() PARALLEL RESTRICTED;
ALTER FUNCTION rl_stats_reset() PARALLEL UNSAFE;

-- A policy definition validated as rl_policy_set validates it, storing nothing.
CREATE FUNCTION "rl_policy_validate"("definition" jsonb) RETURNS jsonb
IMMUTABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_policy_validate_wrapper';
COMMENT ON FUNCTION rl_policy_validate(jsonb) IS
  'validate a policy definition as rl_policy_set does, storing nothing: the same errors, naming the field; returns the definition with every field';

-- The in-server checks, run by the library a user installed on the server it runs on.
CREATE FUNCTION "rl_self_test"() RETURNS jsonb
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_self_test_wrapper';
COMMENT ON FUNCTION rl_self_test() IS
  'checks this build of the library against this server: each answer it lays out in jsonb is byte for byte what the server''s jsonb_in makes of its text, and each function''s catalog entry is what the library''s table says; returns the number of checks and the failures (rl_admin only)';

-- The subjects rl_check refuses most, per policy: a summary in memory beside the counters,
-- forgotten by rl_stats_reset, and the view of every policy's.
CREATE FUNCTION "rl_top_refused"("policy" text, "n" bigint DEFAULT 10) RETURNS jsonb
VOLATILE PARALLEL RESTRICTED
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_top_refused_wrapper';
COMMENT ON FUNCTION rl_spend(text, text, double precision, double precision, double precision) IS
  'calendar budget (an hour, day, ISO week from Monday, month or year, in UTC unless the period names an anchor and a time zone, as ''month from 15 09:00 in Europe/Paris''): spend cost (all or nothing) against quota; returns jsonb';
COMMENT ON FUNCTION rl_top_refused(text, bigint) IS
  'the n (1 to 64) subjects rl_check refused most under policy (or rl_check_limits under that name) since rl_stats_reset, most first: subject, refusals (at most error more than the true count), error, last_refused_ms; from a summary of 64 subjects per policy, with the scope of rl_policy_stats; the view rl_refused lists every policy''s (rl_admin only)';
COMMENT ON FUNCTION rl_policy_stats() IS
  'counts of rl_check per policy (admitted, refused, would_refuse in shadow mode, refused_blocked), and of rl_check_limits per name, since the last reset, and their scope: server (PostgreSQL, preloaded), session (PostgreSQL, not preloaded) or process (SQLite); the view rl_stats lists them (rl_admin only)';
COMMENT ON FUNCTION rl_stats_reset() IS
  'forget the counts of rl_policy_stats and the subjects of rl_top_refused; returns how many policies had counts (rl_admin only)';
-- The subjects rl_check refused most, every policy's (after rl_top_refused, which it reads).
CREATE VIEW rl_refused AS
    SELECT p.policy, e ->> 'subject' AS subject, (e ->> 'refusals')::bigint AS refusals,
           (e ->> 'error')::bigint AS error, (e ->> 'last_refused_ms')::bigint AS last_refused_ms
    FROM (SELECT pg_catalog.jsonb_object_keys(rl_policy_stats() -> 'policies') AS policy) AS p,
         pg_catalog.jsonb_array_elements(rl_top_refused(p.policy, 64) -> 'subjects') AS e;
COMMENT ON VIEW rl_refused IS 'the subjects rl_check refused most per policy since rl_stats_reset (rl_top_refused): refusals are at most error above the true count; readable by rl_admin';

-- A budget row keeps the quota of the spend that last wrote it (0: none known, as for every
-- row written before 0.4.0), so that rl_budgets_near can list the budgets near it. Adding a
-- column with a constant default rewrites no row.
ALTER TABLE ratelimit.rl_budget ADD COLUMN quota bigint NOT NULL DEFAULT 0;
COMMENT ON TABLE ratelimit.rl_budget IS 'calendar budgets: used millionths in the period ending at resets_at (epoch ms), against the quota (millionths) of the last spend, 0 when none';
DROP FUNCTION ratelimit.rl_budget_guard(bigint, bigint);
CREATE FUNCTION ratelimit."rl_budget_guard"("used" bigint, "resets_at" bigint, "quota" bigint) RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE COST 1000
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_budget_guard_wrapper';
COMMENT ON FUNCTION ratelimit.rl_budget_guard(bigint, bigint, bigint) IS
  'internal: hands a budget row to the decision of the rl_* call in progress; true when it writes';
CREATE FUNCTION ratelimit."rl_budget_new_quota"() RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_budget_new_quota_wrapper';
COMMENT ON FUNCTION ratelimit.rl_budget_new_quota() IS
  'internal: the quota the call in progress writes';
-- The budgets near their quota: a scan of every budget row, for rl_admin.
CREATE FUNCTION "rl_budgets_near"("fraction" double precision, "n" bigint DEFAULT 100,
                                  "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_budgets_near_wrapper';
COMMENT ON FUNCTION rl_budgets_near(double precision, bigint, double precision) IS
  'the budgets of the current period that used at least fraction of their quota (the quota the last rl_spend, rl_take_all or rl_check gave), the largest share first, at most n (1 to 10000): key, period, used, quota, resets_at; a scan of every budget row (rl_admin only)';
-- The inverse of rl_take_all: each limit of the list given its cost back, in one unit.
CREATE FUNCTION "rl_refund_all"("limits" jsonb, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_refund_all_wrapper';
COMMENT ON FUNCTION rl_refund_all(jsonb, double precision) IS
  'give each limit of an rl_take_all list its cost back, in one unit (after an admitted rl_take_all whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb';
-- Costs known after the work, charged whatever the limits hold, and a policy's check that
-- charges nothing.
CREATE FUNCTION "rl_charge_all"("limits" jsonb, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_charge_all_wrapper';
COMMENT ON FUNCTION rl_charge_all(jsonb, double precision) IS
  'charge each limit of an rl_take_all list its cost whatever it holds (a cost known after the work), in one unit: buckets into debt, budgets past their quota, windows past their limit; returns jsonb (remaining below 0 where a limit went past)';
CREATE FUNCTION "rl_charge_check"("policy" text, "subject" text, "amount" double precision,
                                  "tier" text DEFAULT NULL, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_charge_check_wrapper';
COMMENT ON FUNCTION rl_charge_check(text, text, double precision, text, double precision) IS
  'charge amount to every limit of a policy for subject, scaled by the tier, whatever they hold (a cost known after the work): buckets into debt, budgets past their quota, windows past their limit; returns jsonb';
CREATE FUNCTION "rl_peek_check"("policy" text, "subject" text, "cost" double precision DEFAULT 1,
                                "tier" text DEFAULT NULL, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_peek_check_wrapper';
COMMENT ON FUNCTION rl_peek_check(text, text, double precision, text, double precision) IS
  'what rl_check with the same arguments would return, charging and counting nothing (cost 0 reads what is left)';

-- Explicit limits counted under a name, as rl_check counts a policy.
CREATE FUNCTION "rl_check_limits"("name" text, "subject" text, "limits" jsonb,
                                  "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_check_limits_wrapper';
COMMENT ON FUNCTION rl_check_limits(text, text, jsonb, double precision) IS
  'rl_take_all of explicit limits, counted as rl_check counts a policy: the outcome under name in rl_policy_stats, a refused subject in rl_top_refused(name) (a route''s name, the web packages'' way to show routes without a policy to operators); returns rl_take_all''s jsonb';

-- Fixed windows: a count per window aligned to the epoch, anew at each window's start.
CREATE FUNCTION "rl_fixed_window"("key" text, "limit" double precision, "window_seconds" double precision,
                                  "cost" double precision DEFAULT 1, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_fixed_window_wrapper';
COMMENT ON FUNCTION rl_fixed_window(text, double precision, double precision, double precision, double precision) IS
  'fixed window: admit cost (all or nothing) when the units admitted under key in the current window (window_seconds long, aligned to the Unix epoch, counted anew at each window''s start) plus cost are at most limit; returns jsonb';
CREATE FUNCTION "rl_fixed_window_peek"("key" text, "limit" double precision, "window_seconds" double precision,
                                       "cost" double precision DEFAULT 1, "now_ms" double precision DEFAULT NULL) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_fixed_window_peek_wrapper';
COMMENT ON FUNCTION rl_fixed_window_peek(text, double precision, double precision, double precision, double precision) IS
  'what rl_fixed_window with the same arguments would return, recording nothing';

-- Ended budget periods kept for invoicing: written when a write starts a budget's next
-- period and by rl_sweep before it removes an ended row; read by rl_usage.
CREATE TABLE ratelimit.rl_usage (
    key       text   NOT NULL,
    period    text   NOT NULL,
    starts_at bigint NOT NULL,
    ends_at   bigint NOT NULL,
    used      bigint NOT NULL,
    quota     bigint NOT NULL,
    PRIMARY KEY (key, period, ends_at)
);
REVOKE ALL ON ratelimit.rl_usage FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_usage', '');
COMMENT ON TABLE ratelimit.rl_usage IS 'ended budget periods kept for invoicing (rl_usage): used and the last spend''s quota in millionths, starts_at and ends_at in epoch ms; rl_sweep removes them 400 days after they end (rl_usage_retention)';
-- rl_usage_all pages through every key's ended periods by end, key and period, the texts in
-- byte order whatever the database's collation; rl_sweep finds those past their retention.
CREATE INDEX rl_usage_ended ON ratelimit.rl_usage (ends_at, key COLLATE "C", period COLLATE "C");
COMMENT ON INDEX ratelimit.rl_usage_ended IS 'kept periods by end, key and period in byte order: rl_usage_all''s pages and rl_sweep''s cutoff';
CREATE FUNCTION "rl_usage"("key" text, "from_ms" double precision, "to_ms" double precision) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_usage_wrapper';
COMMENT ON FUNCTION rl_usage(text, double precision, double precision) IS
  'the ended periods of key''s budgets, kept for invoicing, that ended after from_ms and by to_ms (epoch ms), by end then period: period, starts_at, ends_at (epoch seconds), used and quota (the last spend''s) in exact decimals; kept 400 days, then rl_sweep removes them; at most 10000 periods';
CREATE FUNCTION "rl_usage_all"("from_ms" double precision, "to_ms" double precision, "after" jsonb DEFAULT NULL,
                               "n" bigint DEFAULT 1000) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_usage_all_wrapper';
COMMENT ON FUNCTION rl_usage_all(double precision, double precision, jsonb, bigint) IS
  'every key''s ended budget periods kept for invoicing that ended after from_ms and by to_ms (epoch ms), a page of at most n (1 to 10000) by end, then key, then period (in byte order): key, period, starts_at, ends_at (epoch seconds), used and quota in exact decimals; next is where the page stopped, to pass as after for the next page, or null after the last (rl_admin only)';

-- How long rl_sweep keeps ended periods, set by an administrator (rl_usage_retention).
CREATE TABLE ratelimit.rl_setting (
    name  text   NOT NULL PRIMARY KEY,
    value bigint NOT NULL
);
REVOKE ALL ON ratelimit.rl_setting FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_setting', '');
COMMENT ON TABLE ratelimit.rl_setting IS 'settings of the installation by name: usage_retention_ms, how long rl_sweep keeps ended budget periods (rl_usage_retention, rl_admin only)';
CREATE FUNCTION "rl_usage_retention"("days" bigint DEFAULT NULL) RETURNS bigint
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_usage_retention_wrapper';
COMMENT ON FUNCTION rl_usage_retention(bigint) IS
  'how many days rl_sweep keeps ended budget periods (rl_usage) after they end: with days (1 to 36500), set it first; returns the retention in force (default 400; rl_admin only)';

-- The compact answers: the hot calls' decision and the numbers of the X- headers as text,
-- for callers that need no more (no jsonb built, printed or sent).
CREATE FUNCTION "rl_take_compact"("key" text, "burst" double precision, "refill_per_minute" double precision,
                                  "cost" double precision DEFAULT 1, "now_ms" double precision DEFAULT NULL) RETURNS text
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_take_compact_wrapper';
COMMENT ON FUNCTION rl_take_compact(text, double precision, double precision, double precision, double precision) IS
  'the same call as rl_take, answered as text of five numbers for callers that need only the decision and the headers: ''admitted limit remaining reset retry_after'', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives rl_take''s answer (0 where it gives none); no JSON is built or printed';
CREATE FUNCTION "rl_check_compact"("policy" text, "subject" text, "cost" double precision DEFAULT 1,
                                   "tier" text DEFAULT NULL, "now_ms" double precision DEFAULT NULL) RETURNS text
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_check_compact_wrapper';
COMMENT ON FUNCTION rl_check_compact(text, text, double precision, text, double precision) IS
  'the same call as rl_check, answered as text of five numbers for callers that need only the decision and the headers: ''admitted limit remaining reset retry_after'', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives rl_check''s answer (0 where it gives none); no JSON is built or printed';
CREATE FUNCTION "rl_take_all_compact"("limits" jsonb, "now_ms" double precision DEFAULT NULL) RETURNS text
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_take_all_compact_wrapper';
COMMENT ON FUNCTION rl_take_all_compact(jsonb, double precision) IS
  'the same call as rl_take_all, answered as text of five numbers for callers that need only the decision and the headers: ''admitted limit remaining reset retry_after'', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives rl_take_all''s answer (0 where it gives none); no JSON is built or printed';

-- generated: privileges (codegen/src/privileges.rs; RL_BLESS=1 cargo test -p ratelimit_codegen --test generated)
-- Privileges: exactly what the extension intends, whatever ALTER DEFAULT PRIVILEGES granted
-- when these objects were created (generated by codegen/src/privileges.rs).
DO $rl_privileges$
DECLARE
    admin_role boolean := EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'rl_admin');
    existing oid[] := pg_catalog.string_to_array(
        coalesce(pg_catalog.current_setting('pg_ratelimit_install.existing_functions', true), ''), ' ')::oid[];
    o record;
    who text;
BEGIN
    FOR o IN
        -- the state: the owner's alone
        SELECT 'SCHEMA' AS kind, 'ratelimit' AS name, n.nspacl AS acl, 'n' AS type, n.nspowner AS owner,
               NULL::text AS grant_to, true AS private
        FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'ratelimit'
        UNION ALL
        SELECT 'TABLE', c.oid::regclass::text, c.relacl, 'r', c.relowner, NULL, true
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'ratelimit'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
        UNION ALL
        SELECT 'FUNCTION', p.oid::regprocedure::text, p.proacl, 'f', p.proowner, NULL, true
        FROM pg_catalog.pg_proc AS p WHERE p.pronamespace OPERATOR(pg_catalog.=) 'ratelimit'::regnamespace
        UNION ALL
        -- administration: the owner and rl_admin
        SELECT 'FUNCTION', p.oid::regprocedure::text, p.proacl, 'f', p.proowner,
               CASE WHEN admin_role THEN 'EXECUTE' END, true
        FROM pg_catalog.unnest(ARRAY[
         'rl_reset(text)',
         'rl_policy_set(text, jsonb)',
         'rl_policy_drop(text)',
         'rl_unblock(text, double precision)',
         'rl_policy_stats()',
         'rl_stats_reset()',
         'rl_top_refused(text, bigint)',
         'rl_budgets_near(double precision, bigint, double precision)',
         'rl_usage_all(double precision, double precision, jsonb, bigint)',
         'rl_usage_retention(bigint)',
         'rl_self_test()']::regprocedure[]) AS f(oid)
        JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) f.oid
        UNION ALL
        SELECT 'TABLE', c.oid::regclass::text, c.relacl, 'r', c.relowner, CASE WHEN admin_role THEN 'SELECT' END, true
        FROM pg_catalog.unnest(ARRAY['rl_policies', 'rl_blocks', 'rl_stats', 'rl_refused']::regclass[]) AS v(oid)
        JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) v.oid
        UNION ALL
        -- the application's: EXECUTE for PUBLIC, unless the function was there before (its
        -- privileges are then the owner's choice, kept)
        SELECT 'FUNCTION', p.oid::regprocedure::text, p.proacl, 'f', p.proowner, 'EXECUTE', false
        FROM pg_catalog.unnest(ARRAY[
         'rl_take(text, double precision, double precision, double precision, double precision)',
         'rl_take_compact(text, double precision, double precision, double precision, double precision)',
         'rl_spend(text, text, double precision, double precision, double precision)',
         'rl_budget(text, text, double precision, double precision, double precision)',
         'rl_sweep(double precision, bigint)',
         'rl_key(text[])',
         'rl_peek(text, double precision, double precision, double precision, double precision)',
         'rl_refund(text, double precision, double precision, double precision, double precision)',
         'rl_refund_budget(text, text, double precision, double precision)',
         'rl_take_all(jsonb, double precision)',
         'rl_take_all_compact(jsonb, double precision)',
         'rl_refund_all(jsonb, double precision)',
         'rl_charge_all(jsonb, double precision)',
         'rl_check_limits(text, text, jsonb, double precision)',
         'rl_window(text, double precision, double precision, double precision, double precision)',
         'rl_window_peek(text, double precision, double precision, double precision, double precision)',
         'rl_fixed_window(text, double precision, double precision, double precision, double precision)',
         'rl_fixed_window_peek(text, double precision, double precision, double precision, double precision)',
         'rl_acquire(text, bigint, double precision, double precision)',
         'rl_release(text, text, double precision)',
         'rl_renew(text, text, double precision, double precision)',
         'rl_in_flight(text, double precision)',
         'rl_charge(text, double precision, double precision, double precision, double precision)',
         'rl_charge_budget(text, text, double precision, double precision)',
         'rl_policy_validate(jsonb)',
         'rl_check(text, text, double precision, text, double precision)',
         'rl_check_compact(text, text, double precision, text, double precision)',
         'rl_refund_check(text, text, double precision, text, double precision)',
         'rl_charge_check(text, text, double precision, text, double precision)',
         'rl_peek_check(text, text, double precision, text, double precision)',
         'rl_penalize(text, bigint, double precision, double precision, double precision, double precision)',
         'rl_block(text, double precision, double precision)',
         'rl_usage(text, double precision, double precision)',
         'rl_headers(jsonb)',
         'rl_version()',
         'rl_memory_stats()']::regprocedure[]) AS f(oid)
        JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) f.oid
        WHERE NOT p.oid OPERATOR(pg_catalog.=) ANY (existing)
    LOOP
        -- every grant to another role goes, but the one intended, when it is exactly that
        FOR who IN
            SELECT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END
            FROM pg_catalog.aclexplode(coalesce(o.acl, pg_catalog.acldefault(o.type::"char", o.owner))) AS a
            LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) a.grantee
            WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
            GROUP BY 1
            HAVING NOT (o.grant_to IS NOT NULL
                        AND pg_catalog.bool_and(a.privilege_type OPERATOR(pg_catalog.=) o.grant_to)
                        AND CASE WHEN o.private THEN 'rl_admin' ELSE 'PUBLIC' END OPERATOR(pg_catalog.=) pg_catalog.min(
                            CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE r.rolname::text END))
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %s', o.kind, o.name, who);
        END LOOP;
        IF o.grant_to IS NOT NULL AND NOT EXISTS (
            SELECT FROM pg_catalog.aclexplode(coalesce(
                (SELECT x.acl FROM (SELECT p.proacl AS acl FROM pg_catalog.pg_proc AS p WHERE o.kind = 'FUNCTION'
                                      AND p.oid OPERATOR(pg_catalog.=) o.name::regprocedure
                                    UNION ALL
                                    SELECT c.relacl FROM pg_catalog.pg_class AS c WHERE o.kind = 'TABLE'
                                      AND c.oid OPERATOR(pg_catalog.=) o.name::regclass) AS x),
                pg_catalog.acldefault(o.type::"char", o.owner))) AS a
            WHERE a.privilege_type OPERATOR(pg_catalog.=) o.grant_to
              AND a.grantee OPERATOR(pg_catalog.=) CASE WHEN o.private
                  THEN (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'rl_admin') ELSE 0 END)
        THEN
            EXECUTE pg_catalog.format('GRANT %s ON %s %s TO %s', o.grant_to, o.kind, o.name,
                                      CASE WHEN o.private THEN 'rl_admin' ELSE 'PUBLIC' END);
        END IF;
    END LOOP;
    -- what no other role may reach: nothing is left but the owner's and rl_admin's
    FOR o IN
        SELECT x.kind, x.name, a.grantee::regrole::text AS grantee
        FROM (SELECT 'table' AS kind, c.oid::regclass::text AS name, c.relacl AS acl, c.relowner AS owner
              FROM pg_catalog.pg_class AS c
              WHERE c.relnamespace OPERATOR(pg_catalog.=) 'ratelimit'::regnamespace
                 OR c.oid OPERATOR(pg_catalog.=) ANY (ARRAY['rl_policies', 'rl_blocks', 'rl_stats', 'rl_refused']::regclass[]::oid[])
              UNION ALL
              SELECT 'function', p.oid::regprocedure::text, p.proacl, p.proowner FROM pg_catalog.pg_proc AS p
              WHERE p.pronamespace OPERATOR(pg_catalog.=) 'ratelimit'::regnamespace
                 OR p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
         'rl_reset(text)',
         'rl_policy_set(text, jsonb)',
         'rl_policy_drop(text)',
         'rl_unblock(text, double precision)',
         'rl_policy_stats()',
         'rl_stats_reset()',
         'rl_top_refused(text, bigint)',
         'rl_budgets_near(double precision, bigint, double precision)',
         'rl_usage_all(double precision, double precision, jsonb, bigint)',
         'rl_usage_retention(bigint)',
         'rl_self_test()']::regprocedure[]::oid[])) AS x,
             pg_catalog.aclexplode(x.acl) AS a
        WHERE a.grantee OPERATOR(pg_catalog.<>) x.owner
          AND (a.grantee OPERATOR(pg_catalog.=) 0
               OR pg_catalog.pg_get_userbyid(a.grantee) OPERATOR(pg_catalog.<>) 'rl_admin')
    LOOP
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('pg_ratelimit: %s %s is still reachable by %s after its privileges were revoked',
                                        o.kind, o.name, CASE WHEN o.grantee = '-' THEN 'PUBLIC' ELSE o.grantee END),
            HINT = 'A role other than the owner granted it; revoke that grant as that role, then install again.';
    END LOOP;
END
$rl_privileges$;
-- end generated
