UPDATE ratelimit.rl_entries SET entries = $1, empty_at = $2
WHERE key OPERATOR(pg_catalog.=) $3 AND kind OPERATOR(pg_catalog.=) $4
  AND entries OPERATOR(pg_catalog.=) $5 AND empty_at OPERATOR(pg_catalog.=) $6
