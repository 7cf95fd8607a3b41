DELETE FROM rl_budget
WHERE resets_at <= $1
  AND (key, period) IN (SELECT key, period FROM rl_budget WHERE resets_at <= $1 LIMIT $2)
