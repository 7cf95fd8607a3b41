-- Generated from shared/src/surface/functions.rs (RL_BLESS=1 cargo test -p ratelimit_codegen --test generated).
-- Deliberate declarations of every function's purpose.
COMMENT ON FUNCTION rl_take(text, double precision, double precision, double precision, double precision) IS
  'token bucket: take cost tokens (all or nothing) from key; burst tokens at most, refilled per minute; returns jsonb';
COMMENT ON FUNCTION rl_take_compact(text, double precision, double precision, double precision, double precision) IS
  'the same call as rl_take, answered as text of five numbers for callers that need only the decision and the headers: ''admitted limit remaining reset retry_after'', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives rl_take''s answer (0 where it gives none); no JSON is built or printed';
COMMENT ON FUNCTION rl_spend(text, text, double precision, double precision, double precision) IS
  'calendar budget (an hour, day, ISO week from Monday, month or year, in UTC unless the period names an anchor and a time zone, as ''month from 15 09:00 in Europe/Paris''): spend cost (all or nothing) against quota; returns jsonb';
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
COMMENT ON FUNCTION rl_take_all_compact(jsonb, double precision) IS
  'the same call as rl_take_all, answered as text of five numbers for callers that need only the decision and the headers: ''admitted limit remaining reset retry_after'', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives rl_take_all''s answer (0 where it gives none); no JSON is built or printed';
COMMENT ON FUNCTION rl_refund_all(jsonb, double precision) IS
  'give each limit of an rl_take_all list its cost back, in one unit (after an admitted rl_take_all whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb';
COMMENT ON FUNCTION rl_charge_all(jsonb, double precision) IS
  'charge each limit of an rl_take_all list its cost whatever it holds (a cost known after the work), in one unit: buckets into debt, budgets past their quota, windows past their limit; returns jsonb (remaining below 0 where a limit went past)';
COMMENT ON FUNCTION rl_check_limits(text, text, jsonb, double precision) IS
  'rl_take_all of explicit limits, counted as rl_check counts a policy: the outcome under name in rl_policy_stats, a refused subject in rl_top_refused(name) (a route''s name, the web packages'' way to show routes without a policy to operators); returns rl_take_all''s jsonb';
COMMENT ON FUNCTION rl_window(text, double precision, double precision, double precision, double precision) IS
  'exact sliding window: admit cost (all or nothing) when the units admitted under key in the last window_seconds plus cost are at most limit; returns jsonb';
COMMENT ON FUNCTION rl_window_peek(text, double precision, double precision, double precision, double precision) IS
  'what rl_window with the same arguments would return, recording nothing';
COMMENT ON FUNCTION rl_fixed_window(text, double precision, double precision, double precision, double precision) IS
  'fixed window: admit cost (all or nothing) when the units admitted under key in the current window (window_seconds long, aligned to the Unix epoch, counted anew at each window''s start) plus cost are at most limit; returns jsonb';
COMMENT ON FUNCTION rl_fixed_window_peek(text, double precision, double precision, double precision, double precision) IS
  'what rl_fixed_window with the same arguments would return, recording nothing';
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
COMMENT ON FUNCTION rl_policy_validate(jsonb) IS
  'validate a policy definition as rl_policy_set does, storing nothing: the same errors, naming the field; returns the definition with every field';
COMMENT ON FUNCTION rl_policy_drop(text) IS
  'delete a policy; returns whether it existed (rl_admin only)';
COMMENT ON FUNCTION rl_check(text, text, double precision, text, double precision) IS
  'apply every limit of a policy to subject, all or nothing, scaled by the tier''s multiplier; returns jsonb';
COMMENT ON FUNCTION rl_check_compact(text, text, double precision, text, double precision) IS
  'the same call as rl_check, answered as text of five numbers for callers that need only the decision and the headers: ''admitted limit remaining reset retry_after'', admitted 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and Retry-After values rl_headers gives rl_check''s answer (0 where it gives none); no JSON is built or printed';
COMMENT ON FUNCTION rl_refund_check(text, text, double precision, text, double precision) IS
  'give cost back to every limit of a policy for subject, scaled by the tier (after an admitted rl_check whose work failed): buckets never above burst, budgets never below 0, windows forget their newest admissions; returns jsonb';
COMMENT ON FUNCTION rl_charge_check(text, text, double precision, text, double precision) IS
  'charge amount to every limit of a policy for subject, scaled by the tier, whatever they hold (a cost known after the work): buckets into debt, budgets past their quota, windows past their limit; returns jsonb';
COMMENT ON FUNCTION rl_peek_check(text, text, double precision, text, double precision) IS
  'what rl_check with the same arguments would return, charging and counting nothing (cost 0 reads what is left)';
COMMENT ON FUNCTION rl_penalize(text, bigint, double precision, double precision, double precision, double precision) IS
  'record a strike against subject; past free_strikes it is blocked for min(base_seconds * 2^(strikes - free_strikes), max_seconds); strikes are forgotten window_seconds after the last, never sooner than an earlier strike''s window said; returns jsonb';
COMMENT ON FUNCTION rl_block(text, double precision, double precision) IS
  'block subject for seconds (NULL: until rl_unblock), never shortening a block in force: rl_check refuses it for every enforced policy; returns jsonb';
COMMENT ON FUNCTION rl_unblock(text, double precision) IS
  'lift the block on subject and forget its strikes; returns whether it was blocked (rl_admin only)';
COMMENT ON FUNCTION rl_policy_stats() IS
  'counts of rl_check per policy (admitted, refused, would_refuse in shadow mode, refused_blocked), and of rl_check_limits per name, since the last reset, and their scope: server (PostgreSQL, preloaded), session (PostgreSQL, not preloaded) or process (SQLite); the view rl_stats lists them (rl_admin only)';
COMMENT ON FUNCTION rl_stats_reset() IS
  'forget the counts of rl_policy_stats and the subjects of rl_top_refused; returns how many policies had counts (rl_admin only)';
COMMENT ON FUNCTION rl_top_refused(text, bigint) IS
  'the n (1 to 64) subjects rl_check refused most under policy (or rl_check_limits under that name) since rl_stats_reset, most first: subject, refusals (at most error more than the true count), error, last_refused_ms; from a summary of 64 subjects per policy, with the scope of rl_policy_stats; the view rl_refused lists every policy''s (rl_admin only)';
COMMENT ON FUNCTION rl_budgets_near(double precision, bigint, double precision) IS
  'the budgets of the current period that used at least fraction of their quota (the quota the last rl_spend, rl_take_all or rl_check gave), the largest share first, at most n (1 to 10000): key, period, used, quota, resets_at; a scan of every budget row (rl_admin only)';
COMMENT ON FUNCTION rl_usage(text, double precision, double precision) IS
  'the ended periods of key''s budgets, kept for invoicing, that ended after from_ms and by to_ms (epoch ms), by end then period: period, starts_at, ends_at (epoch seconds), used and quota (the last spend''s) in exact decimals; kept 400 days, then rl_sweep removes them; at most 10000 periods';
COMMENT ON FUNCTION rl_usage_all(double precision, double precision, jsonb, bigint) IS
  'every key''s ended budget periods kept for invoicing that ended after from_ms and by to_ms (epoch ms), a page of at most n (1 to 10000) by end, then key, then period (in byte order): key, period, starts_at, ends_at (epoch seconds), used and quota in exact decimals; next is where the page stopped, to pass as after for the next page, or null after the last (rl_admin only)';
COMMENT ON FUNCTION rl_usage_retention(bigint) IS
  'how many days rl_sweep keeps ended budget periods (rl_usage) after they end: with days (1 to 36500), set it first; returns the retention in force (default 400; rl_admin only)';
COMMENT ON FUNCTION rl_headers(jsonb) IS
  'HTTP headers (RateLimit-Policy, RateLimit, X-RateLimit-*, Retry-After) for any rl_* result';
COMMENT ON FUNCTION rl_version() IS
  'the version of the library answering (in PostgreSQL, compare the extension version in pg_extension)';
COMMENT ON FUNCTION rl_memory_stats() IS
  'the memory store (pg_ratelimit.buckets = memory): buckets it can hold and holds, new keys that replaced a bucket full again or early, buckets saved at the last clean shutdown and loaded at start; returns jsonb';
COMMENT ON FUNCTION rl_self_test() IS
  'checks this build of the library against this server: each answer it lays out in jsonb is byte for byte what the server''s jsonb_in makes of its text, and each function''s catalog entry is what the library''s table says; returns the number of checks and the failures (rl_admin only)';
COMMENT ON FUNCTION ratelimit.rl_bucket_guard(double precision, bigint, bigint) IS
  'internal: hands a bucket row to the decision of the rl_* call in progress; true when it writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_level() IS
  'internal: the level the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_refilled_at() IS
  'internal: the refilled_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_full_at() IS
  'internal: the full_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_guard(bigint, bigint, bigint) IS
  'internal: hands a budget row to the decision of the rl_* call in progress; true when it writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_used() IS
  'internal: the used the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_resets_at() IS
  'internal: the resets_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_quota() IS
  'internal: the quota the call in progress writes';

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
