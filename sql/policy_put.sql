INSERT INTO ratelimit.rl_policy (name, definition) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition
