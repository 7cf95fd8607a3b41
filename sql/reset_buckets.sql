DELETE FROM rl_bucket WHERE key = $1
