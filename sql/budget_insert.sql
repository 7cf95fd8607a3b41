INSERT INTO ratelimit.rl_budget (key, period, used, resets_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (key, period) DO NOTHING
