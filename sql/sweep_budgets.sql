DELETE FROM rl_budget WHERE resets_at <= $1
