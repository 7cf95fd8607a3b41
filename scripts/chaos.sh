#!/usr/bin/env bash
# The chaos run (not in CI; about 20 minutes: RL_CHAOS_SECONDS, 600, then
# RL_WEB_CHAOS_SECONDS, 90, per web package and engine): clients take and spend on a few
# keys directly and through pgbouncer, on the SQL edition and on the memory store,
# while bench/chaos.py kills backends, restarts PostgreSQL 15 (fast, fast with a backend
# killed during the shutdown, and immediate) and stops pgbouncer; it checks the clients'
# records against the state and writes bench/results/chaos.md; then bench/web_chaos.py runs
# each web package's server under load while PostgreSQL restarts and while SQLite's file is
# locked, and adds its section.
#   scripts/chaos.sh                 the run (installs pgbouncer, builds, starts, stops)
#   scripts/chaos.sh bouncer-start   (for the driver) start pgbouncer
#   scripts/chaos.sh bouncer-stop    (for the driver) stop pgbouncer
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
export RL_PG_BIN=${RL_PG_BIN:-$(dirname "$(pg_config_of 15)")}
export RL_PG_DIR=/tmp/pg_ratelimit_chaos RL_PG_PORT=54333
export RL_BOUNCER_DIR=/tmp/pg_ratelimit_chaos_bouncer RL_BOUNCER_PORT=54334
as_pg() { runuser -u postgres -- "$@"; }

bouncer_start() {
  mkdir -p "$RL_BOUNCER_DIR"
  cat >"$RL_BOUNCER_DIR/pgbouncer.ini" <<EOF
[databases]
chaos = host=$RL_PG_DIR port=$RL_PG_PORT dbname=chaos user=postgres
[pgbouncer]
listen_addr =
listen_port = $RL_BOUNCER_PORT
unix_socket_dir = $RL_BOUNCER_DIR
auth_type = trust
auth_file = $RL_BOUNCER_DIR/users.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 100
server_login_retry = 1
logfile = $RL_BOUNCER_DIR/pgbouncer.log
pidfile = $RL_BOUNCER_DIR/pgbouncer.pid
EOF
  echo '"postgres" ""' >"$RL_BOUNCER_DIR/users.txt"
  chown -R postgres "$RL_BOUNCER_DIR"
  as_pg pgbouncer -d "$RL_BOUNCER_DIR/pgbouncer.ini"
}

bouncer_stop() {
  local pid
  pid=$(cat "$RL_BOUNCER_DIR/pgbouncer.pid" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

case "${1:-run}" in
  bouncer-start) bouncer_start; exit ;;
  bouncer-stop) bouncer_stop; exit ;;
  run) ;;
  *) echo "usage: $0 [bouncer-start|bouncer-stop]" >&2; exit 2 ;;
esac

bash scripts/setup.sh --pg
if ! command -v pgbouncer >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
fi
cleanup() {
  bouncer_stop
  bash scripts/pg_cluster.sh stop
  rm -rf "$RL_BOUNCER_DIR"
}
trap cleanup EXIT
bash scripts/pg_cluster.sh stop
CC=clang cargo pgrx install -p pg_ratelimit --release --pg-config "$(pg_config_of 15)" \
  --no-default-features --features pg15 >/dev/null
eval "$(bash scripts/pg_cluster.sh start)"
as_pg "$RL_PG_BIN/psql" -X -q -h "$RL_PG_DIR" -p "$RL_PG_PORT" -d postgres -v ON_ERROR_STOP=1 \
  -c "CREATE DATABASE chaos" -c "ALTER DATABASE chaos SET pg_ratelimit.allow_explicit_clock = on"
as_pg "$RL_PG_BIN/psql" -X -q -h "$RL_PG_DIR" -p "$RL_PG_PORT" -d chaos -v ON_ERROR_STOP=1 \
  -c "CREATE EXTENSION pg_ratelimit"
# the memory store, in a database of its own (its buckets in shared memory, its budgets in
# its tables)
as_pg "$RL_PG_BIN/psql" -X -q -h "$RL_PG_DIR" -p "$RL_PG_PORT" -d postgres -v ON_ERROR_STOP=1 \
  -c "CREATE DATABASE chaos_memory" -c "ALTER DATABASE chaos_memory SET pg_ratelimit.allow_explicit_clock = on" \
  -c "ALTER DATABASE chaos_memory SET pg_ratelimit.buckets = 'memory'"
as_pg "$RL_PG_BIN/psql" -X -q -h "$RL_PG_DIR" -p "$RL_PG_PORT" -d chaos_memory -v ON_ERROR_STOP=1 \
  -c "CREATE EXTENSION pg_ratelimit"
# the SQL edition beside it, in a database of its own, installed as managed platforms do:
# by the database's owner, a role with CREATEROLE and no superuser (the clients, connecting
# as postgres, may pass an explicit clock as any superuser may)
bash scripts/package.sh --sql >/dev/null
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
as_pg "$RL_PG_BIN/psql" -X -q -h "$RL_PG_DIR" -p "$RL_PG_PORT" -d postgres -v ON_ERROR_STOP=1 \
  -c "CREATE ROLE chaos_owner LOGIN CREATEROLE" -c "CREATE DATABASE chaos_sql OWNER chaos_owner"
as_pg "$RL_PG_BIN/psql" -X -q -h "$RL_PG_DIR" -p "$RL_PG_PORT" -U chaos_owner -d chaos_sql -v ON_ERROR_STOP=1 \
  -f "$PWD/dist/pg_ratelimit_sql-$version.sql" >/dev/null
bouncer_start
# the web packages' run (bench/web_chaos.py) serves the test application of each package:
# the SQLite extension, the packages and their dependencies, as the test command builds them
npm_config_better_sqlite3_local_prebuilds=$(bash scripts/better_sqlite3.sh)
export npm_config_better_sqlite3_local_prebuilds
bash scripts/package.sh --sqlite >/dev/null
"$WEB_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall ./integrations/python
status=0
/usr/bin/python3 bench/chaos.py || status=1
"$WEB_VENV/bin/python" bench/web_chaos.py || status=1
exit $status
