UPDATE rl_bucket SET level = $1, refilled_at = $2, full_at = $3
WHERE key = $4 AND level = $5 AND refilled_at = $6
