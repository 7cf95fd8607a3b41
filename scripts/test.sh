#!/usr/bin/env bash
# The whole test suite: core unit and property tests, in-server pgrx tests, and black-box
# client tests of both built extensions (SQLite via Python's sqlite3 and the sqlite3 shell,
# PostgreSQL via psycopg2 against a throwaway cluster). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "setup"
bash scripts/setup.sh --pg

step "core: unit and property tests"
cargo test -p ratelimit_core

step "postgres: in-server tests (cargo pgrx test)"
pgrx_data=$(mktemp -d /tmp/pg_ratelimit_pgrx.XXXXXX)
chown postgres:postgres "$pgrx_data"
cargo pgrx test pg15 -p pg_ratelimit --runas postgres --pgdata "$pgrx_data"
rm -rf "$pgrx_data"

step "build: SQLite extension and installed PostgreSQL extension"
cargo build --release -p sqlite_ratelimit
cargo pgrx install -p pg_ratelimit --release --pg-config "$PG_CONFIG"

step "client tests against both engines"
trap 'bash scripts/pg_cluster.sh stop' EXIT
eval "$(bash scripts/pg_cluster.sh start)"
RL_REQUIRE_PG=1 /usr/bin/python3 -m pytest -p no:cacheprovider -v tests
