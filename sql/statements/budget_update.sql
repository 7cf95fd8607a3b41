UPDATE ratelimit.rl_budget SET used = $1, resets_at = $2, quota = $3
WHERE key OPERATOR(pg_catalog.=) $4 AND period OPERATOR(pg_catalog.=) $5
  AND used OPERATOR(pg_catalog.=) $6 AND resets_at OPERATOR(pg_catalog.=) $7 AND quota OPERATOR(pg_catalog.=) $8
