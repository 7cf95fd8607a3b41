UPDATE ratelimit.rl_bucket SET level = $1, refilled_at = $2, full_at = $3
WHERE key OPERATOR(pg_catalog.=) $4 AND level OPERATOR(pg_catalog.=) $5 AND refilled_at OPERATOR(pg_catalog.=) $6
