INSERT INTO ratelimit.rl_bucket (key, level, refilled_at, full_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO NOTHING
