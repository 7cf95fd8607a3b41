-- rl_check's counters as rows (after rl_policy_stats, which it reads).
CREATE VIEW rl_stats AS
    SELECT key AS policy, (value ->> 'admitted')::bigint AS admitted, (value ->> 'refused')::bigint AS refused,
           (value ->> 'would_refuse')::bigint AS would_refuse, (value ->> 'refused_blocked')::bigint AS refused_blocked
    FROM pg_catalog.jsonb_each(rl_policy_stats() -> 'policies');
COMMENT ON VIEW rl_stats IS 'rl_check counts per policy since rl_stats_reset (see rl_policy_stats for their scope); readable by rl_admin';
