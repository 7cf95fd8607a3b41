SELECT key, period, starts_at, ends_at, used, quota FROM ratelimit.rl_usage
WHERE ends_at OPERATOR(pg_catalog.>) $1 AND ends_at OPERATOR(pg_catalog.<=) $2
  AND (ends_at, key COLLATE "C", period COLLATE "C") OPERATOR(pg_catalog.>) ($3, $4, $5)
ORDER BY ends_at, key COLLATE "C", period COLLATE "C" LIMIT $6
