DELETE FROM rl_budget WHERE key = $1
