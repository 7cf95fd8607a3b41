DELETE FROM rl_bucket WHERE full_at <= $1
