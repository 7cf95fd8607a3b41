-- pg_ratelimit 0.2.0 -> 0.3.0: the memory store.
-- pg_ratelimit.buckets = 'memory' keeps token buckets in shared memory (the library in
-- shared_preload_libraries); rl_memory_stats() reports on that table. No stored object
-- changes: buckets and budgets in the tables are kept as they are.

CREATE FUNCTION "rl_memory_stats"() RETURNS jsonb
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_memory_stats_wrapper';
COMMENT ON FUNCTION rl_memory_stats() IS
  'the memory store (pg_ratelimit.buckets = memory): buckets it can hold and holds, new keys that replaced a bucket full again or early, buckets saved at the last clean shutdown and loaded at start; returns jsonb';

