UPDATE ratelimit.rl_bucket
SET level = ratelimit.rl_bucket_new_level(),
    refilled_at = ratelimit.rl_bucket_new_refilled_at(),
    full_at = ratelimit.rl_bucket_new_full_at()
WHERE key OPERATOR(pg_catalog.=) $1
  AND NOT EXISTS (SELECT 1 FROM ratelimit.rl_entries
                  WHERE key OPERATOR(pg_catalog.=) $2 AND kind OPERATOR(pg_catalog.=) 'block'
                    AND empty_at OPERATOR(pg_catalog.>) $3)
  AND EXISTS (SELECT 1 FROM ratelimit.rl_policy
              WHERE name OPERATOR(pg_catalog.=) $4 AND revision OPERATOR(pg_catalog.=) $5)
  AND ratelimit.rl_bucket_guard(level, refilled_at, full_at)
