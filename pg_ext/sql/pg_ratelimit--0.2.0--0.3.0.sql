-- pg_ratelimit 0.2.0 -> 0.3.0: the memory store, state that survives pg_dump, rl_version().
-- pg_ratelimit.buckets = 'memory' keeps token buckets in shared memory (the library in
-- shared_preload_libraries); rl_memory_stats() reports on that table. The state tables
-- are marked for pg_dump, which left their rows out before (a restored backup had lost
-- every level and spend). Buckets and budgets in the tables are kept as they are.

SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_bucket', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_budget', '');

CREATE FUNCTION "rl_memory_stats"() RETURNS jsonb
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_memory_stats_wrapper';
COMMENT ON FUNCTION rl_memory_stats() IS
  'the memory store (pg_ratelimit.buckets = memory): buckets it can hold and holds, new keys that replaced a bucket full again or early, buckets saved at the last clean shutdown and loaded at start; returns jsonb';


CREATE FUNCTION "rl_version"() RETURNS text
STRICT IMMUTABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_version_wrapper';
COMMENT ON FUNCTION rl_version() IS
  'the version of the library answering (in PostgreSQL, compare the extension version in pg_extension)';
