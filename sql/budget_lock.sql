SELECT used, resets_at FROM rl_budget WHERE key = $1 AND period = $2 FOR UPDATE
