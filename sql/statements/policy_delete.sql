DELETE FROM ratelimit.rl_policy WHERE name OPERATOR(pg_catalog.=) $1
