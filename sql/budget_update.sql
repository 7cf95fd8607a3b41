UPDATE rl_budget SET used = $1, resets_at = $2
WHERE key = $3 AND period = $4 AND used = $5 AND resets_at = $6
