SELECT value FROM ratelimit.rl_setting WHERE name OPERATOR(pg_catalog.=) $1
