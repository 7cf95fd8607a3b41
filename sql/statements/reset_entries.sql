DELETE FROM ratelimit.rl_entries WHERE key OPERATOR(pg_catalog.=) $1
