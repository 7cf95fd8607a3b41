SELECT value FROM ratelimit.rl_meta WHERE key OPERATOR(pg_catalog.=) 'checks_epoch'
