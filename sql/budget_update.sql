UPDATE rl_budget SET used = $3, resets_at = $4
WHERE key = $1 AND period = $2 AND used = $5 AND resets_at = $6
