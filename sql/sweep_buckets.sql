DELETE FROM rl_bucket
WHERE full_at <= $1
  AND key IN (SELECT key FROM rl_bucket WHERE full_at <= $1 LIMIT $2)
