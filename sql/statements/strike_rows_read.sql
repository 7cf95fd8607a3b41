SELECT key, entries FROM ratelimit.rl_entries WHERE kind OPERATOR(pg_catalog.=) 'block' LIMIT $1
