SELECT level, refilled_at, full_at FROM rl_bucket WHERE key = $1 FOR UPDATE
