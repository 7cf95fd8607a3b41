SELECT key, period, used, quota, resets_at FROM ratelimit.rl_budget
WHERE resets_at OPERATOR(pg_catalog.>) $1 AND quota OPERATOR(pg_catalog.>) 0
  AND CAST(used AS double precision) OPERATOR(pg_catalog./) CAST(quota AS double precision) OPERATOR(pg_catalog.>=) $2
ORDER BY CAST(used AS double precision) OPERATOR(pg_catalog./) CAST(quota AS double precision) DESC, key COLLATE "C", period COLLATE "C"
LIMIT $3
