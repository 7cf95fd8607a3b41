SELECT key, period, used, resets_at, quota FROM ratelimit.rl_budget
WHERE resets_at OPERATOR(pg_catalog.<=) $1 AND used OPERATOR(pg_catalog.<>) 0
ORDER BY key, period LIMIT $2
