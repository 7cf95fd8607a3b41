DELETE FROM ratelimit.rl_entries
WHERE empty_at OPERATOR(pg_catalog.<=) $1
  AND (key, kind) IN (SELECT key, kind FROM ratelimit.rl_entries WHERE empty_at OPERATOR(pg_catalog.<=) $1 LIMIT $2)
