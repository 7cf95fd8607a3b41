INSERT INTO ratelimit.rl_entries (key, kind, entries, empty_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (key, kind) DO NOTHING
