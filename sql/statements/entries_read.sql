SELECT entries, empty_at FROM ratelimit.rl_entries
WHERE key OPERATOR(pg_catalog.=) $1 AND kind OPERATOR(pg_catalog.=) $2
