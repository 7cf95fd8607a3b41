SELECT used, resets_at, quota FROM ratelimit.rl_budget
WHERE key OPERATOR(pg_catalog.=) $1 AND period OPERATOR(pg_catalog.=) $2
