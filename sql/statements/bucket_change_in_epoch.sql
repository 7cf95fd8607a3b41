UPDATE ratelimit.rl_bucket
SET level = ratelimit.rl_bucket_new_level(),
    refilled_at = ratelimit.rl_bucket_new_refilled_at(),
    full_at = ratelimit.rl_bucket_new_full_at()
WHERE key OPERATOR(pg_catalog.=) $1
  AND (SELECT value FROM ratelimit.rl_meta WHERE key OPERATOR(pg_catalog.=) 'checks_epoch') OPERATOR(pg_catalog.=) $2
  AND ratelimit.rl_bucket_guard(level, refilled_at, full_at)
