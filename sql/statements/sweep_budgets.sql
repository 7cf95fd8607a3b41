DELETE FROM ratelimit.rl_budget
WHERE resets_at OPERATOR(pg_catalog.<=) $1
  AND (key, period) IN (SELECT key, period FROM ratelimit.rl_budget WHERE resets_at OPERATOR(pg_catalog.<=) $1 LIMIT $2)
