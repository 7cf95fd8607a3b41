SELECT level, refilled_at, full_at FROM ratelimit.rl_bucket WHERE key OPERATOR(pg_catalog.=) $1
