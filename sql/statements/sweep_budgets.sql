DELETE FROM ratelimit.rl_budget
WHERE resets_at OPERATOR(pg_catalog.<=) $1
  AND (key, period) IN (SELECT b.key, b.period FROM ratelimit.rl_budget AS b
                        WHERE b.resets_at OPERATOR(pg_catalog.<=) $1
                          AND (b.used OPERATOR(pg_catalog.=) 0 OR EXISTS (
                               SELECT 1 FROM ratelimit.rl_usage AS u
                               WHERE u.key OPERATOR(pg_catalog.=) b.key AND u.period OPERATOR(pg_catalog.=) b.period
                                 AND u.ends_at OPERATOR(pg_catalog.=) b.resets_at))
                        LIMIT $2)
