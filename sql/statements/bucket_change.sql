UPDATE ratelimit.rl_bucket
SET level = ratelimit.rl_bucket_new_level(),
    refilled_at = ratelimit.rl_bucket_new_refilled_at(),
    full_at = ratelimit.rl_bucket_new_full_at()
WHERE key OPERATOR(pg_catalog.=) $1
  AND ratelimit.rl_bucket_guard(level, refilled_at, full_at)
