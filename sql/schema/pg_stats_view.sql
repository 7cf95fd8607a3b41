-- rl_check's counters as rows (after rl_policy_stats, which it reads).
CREATE VIEW rl_stats AS
    SELECT key AS policy, (value ->> 'admitted')::bigint AS admitted, (value ->> 'refused')::bigint AS refused,
           (value ->> 'would_refuse')::bigint AS would_refuse, (value ->> 'refused_blocked')::bigint AS refused_blocked
    FROM pg_catalog.jsonb_each(rl_policy_stats() -> 'policies');
COMMENT ON VIEW rl_stats IS 'rl_check counts per policy since rl_stats_reset (see rl_policy_stats for their scope); readable by rl_admin';
-- The subjects rl_check refused most, every policy's (after rl_top_refused, which it reads).
CREATE VIEW rl_refused AS
    SELECT p.policy, e ->> 'subject' AS subject, (e ->> 'refusals')::bigint AS refusals,
           (e ->> 'error')::bigint AS error, (e ->> 'last_refused_ms')::bigint AS last_refused_ms
    FROM (SELECT pg_catalog.jsonb_object_keys(rl_policy_stats() -> 'policies') AS policy) AS p,
         pg_catalog.jsonb_array_elements(rl_top_refused(p.policy, 64) -> 'subjects') AS e;
COMMENT ON VIEW rl_refused IS 'the subjects rl_check refused most per policy since rl_stats_reset (rl_top_refused): refusals are at most error above the true count; readable by rl_admin';
