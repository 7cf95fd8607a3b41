INSERT INTO ratelimit.rl_policy (name, definition, revision) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition, revision = EXCLUDED.revision
