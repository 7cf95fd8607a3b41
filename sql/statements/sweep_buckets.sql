DELETE FROM ratelimit.rl_bucket
WHERE full_at OPERATOR(pg_catalog.<=) $1
  AND key IN (SELECT key FROM ratelimit.rl_bucket WHERE full_at OPERATOR(pg_catalog.<=) $1 LIMIT $2)
