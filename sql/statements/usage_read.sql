SELECT key, period, starts_at, ends_at, used, quota FROM ratelimit.rl_usage
WHERE key OPERATOR(pg_catalog.=) $1 AND ends_at OPERATOR(pg_catalog.>) $2 AND ends_at OPERATOR(pg_catalog.<=) $3
ORDER BY ends_at, period COLLATE "C" LIMIT $4
