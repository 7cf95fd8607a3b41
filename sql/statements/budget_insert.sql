INSERT INTO ratelimit.rl_budget (key, period, used, resets_at, quota) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (key, period) DO NOTHING
