DELETE FROM ratelimit.rl_bucket WHERE key OPERATOR(pg_catalog.=) $1
