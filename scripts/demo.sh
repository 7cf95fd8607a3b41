#!/usr/bin/env bash
# The main job: build the SQLite extension and show rate limiting on SQLite.
#   bash scripts/demo.sh             the walk on SQLite (examples/demo.sql)
#   bash scripts/demo.sh --postgres  the same walk on PostgreSQL 15 (examples/demo_pg.sql), as
#                                    root: installs PostgreSQL and the extension, runs a throwaway
#                                    cluster as the postgres user on a private port and socket
#                                    folder, and stops and removes it afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--postgres" ]; then
  bash scripts/setup.sh --pg
  export RL_PG_DIR=/tmp/pg_ratelimit_demo RL_PG_PORT=54330
  trap 'bash scripts/pg_cluster.sh stop' EXIT
  # The cluster preloads the library: never overwrite the file under a running server.
  bash scripts/pg_cluster.sh stop
  printf '\033[1m[demo]\033[0m %s\n' "building the PostgreSQL 15 extension (scripts/pg_install.sh 15 --build; minutes the first time)" >&2
  bash scripts/pg_install.sh 15 --build
  eval "$(bash scripts/pg_cluster.sh start)"
  psql -X -q -d postgres -c "CREATE DATABASE demo"
  psql -X -q -d demo -c "CREATE EXTENSION pg_ratelimit" -c "ALTER DATABASE demo SET pg_ratelimit.allow_explicit_clock = on"
  psql -X -q -d demo < examples/demo_pg.sql
  exit 0
fi
say() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }
bash scripts/setup.sh
say "building the SQLite extension (cargo build --release -p sqlite_ratelimit; a minute or two the first time)"
cargo build --quiet --release -p sqlite_ratelimit
say "the walk (examples/demo.sql) in the sqlite3 shell with target/release/libratelimit loaded"
sqlite3 :memory: -cmd ".load target/release/libratelimit" < examples/demo.sql
cat >&2 <<'NEXT'

What to try next:
  sqlite3 app.db -cmd ".load target/release/libratelimit"      then SELECT rl_take('me', 3, 60);
  bash scripts/demo.sh --postgres                               the same walk on PostgreSQL 15
  bash scripts/package.sh --sqlite                              the Python, Node and Ruby packages,
                                                                then integrations/*/README.md's quick starts
  docs/                                                         choosing limits, the reference, operations
NEXT
