#!/usr/bin/env bash
# Benchmarks (a longer run, about 45 minutes): rl_take / rl_spend against a hand-written SQL
# bucket, a bare UPDATE, SELECT 1, a Redis Lua bucket, redis-cell's CL.THROTTLE, and a bare
# SQLite UPSERT.
# Installs and starts everything it needs; writes bench/results/results.md and chart.png.
#   RL_BENCH_SECONDS (3), RL_BENCH_REPS (3), RL_BENCH_SCALES (1000000,10000000) tune it;
#   RL_BENCH_ONLY=memory runs only the memory store section (a few minutes); hotkey one key
#   beside many, per store, 8 and 32 clients, synchronous_commit on and off (a few minutes);
#   edition the SQL edition beside the native table store; instructions the same two
#   databases' rl_take and rl_check counted by callgrind (a few minutes); near rl_budgets_near over a
#   million budget rows on each engine (a minute); usage rl_usage of one key's year among a
#   million keys with twelve ended months each (a few minutes);
#   RL_BENCH_ONLY=targets only the speed targets, every ratio from one interleaved run and
#   a profile of each system (about 12 minutes; shared_buffers holds all of its tables).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench
export RL_PG_DIR=/tmp/pg_ratelimit_bench RL_PG_PORT=54333 RL_PG_PRELOAD=pg_ratelimit
# The cluster preloads the library: never overwrite the file under a running server.
bash scripts/pg_cluster.sh stop
bash scripts/build.sh
export RL_SQLITE_DRIVER=/tmp/rl_sqlite_driver RL_REDIS_PORT=56379
gcc -O2 -o "$RL_SQLITE_DRIVER" bench/sqlite_driver.c -lsqlite3
redis_cell=$(bash scripts/redis_cell.sh)

# PostgreSQL: a throwaway cluster with stated settings (fsync and synchronous_commit on;
# each run sets synchronous_commit for its own sessions).
redis_dir=$(mktemp -d /tmp/rl_redis.XXXXXX)
cleanup() {
  redis-cli -p "$RL_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$redis_dir"
  bash scripts/pg_cluster.sh stop
}
trap cleanup EXIT
bash scripts/pg_cluster.sh stop
eval "$(bash scripts/pg_cluster.sh start)"
cat >> "$RL_PG_DIR/data/postgresql.conf" <<'CONF'
shared_buffers = 6GB
max_connections = 120
checkpoint_timeout = 30min
max_wal_size = 8GB
pg_ratelimit.memory_buckets = 12000000
CONF
runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$RL_PG_DIR/data" -w restart -m fast >/dev/null
psql -X -At -c "SELECT 'PostgreSQL settings: ' || string_agg(name || '=' || setting, ', ') FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'max_wal_size', 'wal_level')" postgres

# Redis: loopback only, no persistence (its fastest configuration), with redis-cell loaded.
redis-server --port "$RL_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --dir "$redis_dir" --logfile "$redis_dir/redis.log" --loadmodule "$redis_cell"
for _ in $(seq 50); do redis-cli -p "$RL_REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$RL_REDIS_PORT" ping >/dev/null 2>&1 || { echo "bench.sh: Redis did not start:" >&2; tail -5 "$redis_dir/redis.log" >&2; exit 1; }

/usr/bin/python3 bench/bench.py
