DELETE FROM ratelimit.rl_usage
WHERE ends_at OPERATOR(pg_catalog.<=) $1
  AND (key, period, ends_at) IN (SELECT key, period, ends_at FROM ratelimit.rl_usage WHERE ends_at OPERATOR(pg_catalog.<=) $1 LIMIT $2)
