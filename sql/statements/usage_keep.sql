INSERT INTO ratelimit.rl_usage (key, period, starts_at, ends_at, used, quota) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (key, period, ends_at) DO NOTHING
