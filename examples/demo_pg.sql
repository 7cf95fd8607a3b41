-- The walk of examples/demo.sql on PostgreSQL (scripts/demo.sh --postgres). Times are
-- explicit (now_ms), which the demo's database allows (pg_ratelimit.allow_explicit_clock,
-- a superuser setting); leave now_ms out to use the server's clock.
\pset footer off
\echo 'The walk''s clock is fixed (each call passes now_ms), so it prints the same on every run;'
\echo 'leave now_ms out and the calls use the real clock.'
\echo ''
\echo '1. A token bucket: burst 3, refilling 60 per minute (one token a second).'
WITH calls(n, t, now_ms) AS (VALUES
    (1, 'request 1 at 0 ms', 0), (2, 'request 2 at 0 ms', 0), (3, 'request 3 at 0 ms', 0),
    (4, 'request 4 at 0 ms', 0), (5, 'request 5 at 999 ms', 999), (6, 'request 6 at 1000 ms', 1000)),
results AS MATERIALIZED (SELECT n, t, rl_take('user:42', 3, 60, 1, now_ms) AS r FROM calls ORDER BY n)
SELECT t AS call,
       r -> 'admitted' AS admitted,
       r ->> 'remaining' AS remaining,
       r ->> 'retry_after_ms' AS retry_after_ms,
       r ->> 'retry_after_seconds' AS "Retry-After"
FROM results ORDER BY n;

\echo '2. Keys built from parts never collide; each key has its own bucket.'
SELECT rl_key('tenant-7', 'user:42') AS key,
       rl_take(rl_key('tenant-7', 'user:42'), 3, 60, 1, 0) ->> 'remaining' AS remaining_after_one_take;

\echo '3. A daily budget of 1.00 spent in exact steps of 0.30 (UTC calendar day).'
WITH calls(n) AS (VALUES (1), (2), (3), (4)),
results AS MATERIALIZED (SELECT n, rl_spend('tenant-7', 'day', 1, 0.3, 1795953600000) AS r FROM calls ORDER BY n)
SELECT 'spend ' || n || ' of 0.30' AS call,
       r -> 'admitted' AS admitted,
       r ->> 'used' AS used,
       r ->> 'remaining' AS remaining,
       to_char(to_timestamp((r ->> 'resets_at')::bigint) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS resets_at,
       r ->> 'retry_after_seconds' AS retry_after_seconds
FROM results ORDER BY n;

\echo '4. rl_budget asks without spending; rl_sweep drops rows that no longer matter.'
WITH asked(r) AS MATERIALIZED (SELECT rl_budget('tenant-7', 'day', 1, 0.1, 1795953600000))
SELECT r -> 'admitted' AS "would 0.10 pass", r ->> 'used' AS used_after_it, r ->> 'remaining' AS remaining,
       rl_sweep(1795953600000) AS rows_swept
FROM asked;
SELECT 'state rows: ' || (SELECT count(*) FROM ratelimit.rl_bucket) || ' buckets, '
       || (SELECT count(*) FROM ratelimit.rl_budget) || ' budgets' AS state;
