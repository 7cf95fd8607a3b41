UPDATE ratelimit.rl_budget
SET used = ratelimit.rl_budget_new_used(),
    resets_at = ratelimit.rl_budget_new_resets_at(),
    quota = ratelimit.rl_budget_new_quota()
WHERE key OPERATOR(pg_catalog.=) $1 AND period OPERATOR(pg_catalog.=) $2
  AND ratelimit.rl_budget_guard(used, resets_at, quota)
