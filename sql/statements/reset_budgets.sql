DELETE FROM ratelimit.rl_budget WHERE key OPERATOR(pg_catalog.=) $1
