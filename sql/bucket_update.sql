UPDATE rl_bucket SET level = $2, refilled_at = $3, full_at = $4
WHERE key = $1 AND level = $5 AND refilled_at = $6
