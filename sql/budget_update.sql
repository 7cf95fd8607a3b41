UPDATE ratelimit.rl_budget SET used = $1, resets_at = $2
WHERE key OPERATOR(pg_catalog.=) $3 AND period OPERATOR(pg_catalog.=) $4
  AND used OPERATOR(pg_catalog.=) $5 AND resets_at OPERATOR(pg_catalog.=) $6
