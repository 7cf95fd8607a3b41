-- A walk through rate limiting on SQLite. Times are explicit (now_ms) so the story
-- reads the same on every run; leave now_ms out to use the real clock.
-- Each call sits in a MATERIALIZED CTE: SQLite would otherwise copy the call into every
-- place its result is used (r ->> '$.admitted', r ->> '$.remaining', ...) and run it again.
.mode box --wrap 100
.print "The walk's clock is fixed (each call passes now_ms), so it prints the same on every run;"
.print "leave now_ms out and the calls use the real clock."
.print ""
.print "1. A token bucket: burst 3, refilling 60 per minute (one token a second)."
WITH calls(t, now_ms) AS (VALUES
    ('request 1 at 0 ms', 0), ('request 2 at 0 ms', 0), ('request 3 at 0 ms', 0),
    ('request 4 at 0 ms', 0), ('request 5 at 999 ms', 999), ('request 6 at 1000 ms', 1000)),
results AS MATERIALIZED (SELECT t, rl_take('user:42', 3, 60, 1, now_ms) AS r FROM calls)
SELECT t AS "call",
       r -> '$.admitted' AS admitted,
       r ->> '$.remaining' AS remaining,
       r ->> '$.retry_after_ms' AS retry_after_ms,
       r ->> '$.retry_after_seconds' AS "Retry-After"
FROM results;

.print ""
.print "2. Keys built from parts never collide; each key has its own bucket."
SELECT rl_key('tenant-7', 'user:42') AS key,
       rl_take(rl_key('tenant-7', 'user:42'), 3, 60, 1, 0) ->> '$.remaining' AS remaining_after_one_take;

.print ""
.print "3. A daily budget of 1.00 spent in exact steps of 0.30 (UTC calendar day)."
WITH calls(n) AS (VALUES (1), (2), (3), (4)),
results AS MATERIALIZED (SELECT n, rl_spend('tenant-7', 'day', 1, 0.3, 1795953600000) AS r FROM calls)
SELECT 'spend ' || n || ' of 0.30' AS "call",
       r -> '$.admitted' AS admitted,
       r ->> '$.used' AS used,
       r ->> '$.remaining' AS remaining,
       datetime(r ->> '$.resets_at', 'unixepoch') AS resets_at,
       r ->> '$.retry_after_seconds' AS retry_after_seconds
FROM results;

.print ""
.print "4. rl_budget asks without spending; rl_sweep drops rows that no longer matter."
-- The sweep's clock is that of the walk too: both buckets are full again by then, the
-- budget's day has not ended.
WITH asked(r) AS MATERIALIZED (SELECT rl_budget('tenant-7', 'day', 1, 0.1, 1795953600000))
SELECT r -> '$.admitted' AS "would 0.10 pass", r ->> '$.used' AS used_after_it, r ->> '$.remaining' AS remaining,
       rl_sweep(1795953600000) AS rows_swept
FROM asked;
.mode list
SELECT 'state rows: ' || (SELECT count(*) FROM rl_bucket) || ' buckets, ' || (SELECT count(*) FROM rl_budget) || ' budgets';
