#!/usr/bin/env bash
# The test suite.
#   bash scripts/test.sh          everything, as root on a fresh Debian 12 machine: installs what it
#                                 needs (apt packages, cargo-pgrx, a throwaway PostgreSQL 15 cluster),
#                                 runs the core's tests, the in-server pgrx tests and the client tests
#                                 of both built extensions. CI runs this.
#   bash scripts/test.sh --fast   the core's tests and the SQLite client tests: no root, no apt, no
#                                 PostgreSQL; under a minute once built. Needs cargo, sqlite3 and
#                                 Debian's python3 with pytest (scripts/setup.sh installs them once).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
PYTEST=(/usr/bin/python3 -m pytest -p no:cacheprovider)
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [ "${1:-}" = "--fast" ]; then
  for need in cargo sqlite3 /usr/bin/python3; do
    command -v "$need" >/dev/null || { echo "needs $need: run bash scripts/setup.sh once as root" >&2; exit 1; }
  done
  /usr/bin/python3 -c 'import pytest' 2>/dev/null || { echo "needs python3-pytest: run bash scripts/setup.sh once as root" >&2; exit 1; }
  step "core: unit and property tests"
  cargo test -q -p ratelimit_core
  step "build: SQLite extension"
  cargo build --release -p sqlite_ratelimit
  step "SQLite client tests (PostgreSQL ones skip)"
  env -u PGHOST -u RL_REQUIRE_PG RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" "${PYTEST[@]}" -q tests
  exit 0
fi

step "setup"
bash scripts/setup.sh --pg

step "core: unit and property tests"
cargo test -p ratelimit_core

# One release build of pg_ratelimit's dependencies serves both the pgrx tests (which install
# a build with the in-server tests compiled in) and the install the client tests use. Until
# that install has run, the installed extension is the test build: put the release back
# whatever happens.
installed_release=0
restore_release() {
  [ "$installed_release" = 1 ] || cargo pgrx install -p pg_ratelimit --release --pg-config "$PG_CONFIG" >/dev/null
}
cleanup() {
  restore_release
  bash scripts/pg_cluster.sh stop
  [ -z "${pgrx_data:-}" ] || rm -rf "$pgrx_data"
}
trap cleanup EXIT

step "postgres: in-server tests (cargo pgrx test --release)"
pgrx_data=$(mktemp -d /tmp/pg_ratelimit_pgrx.XXXXXX)
chown postgres:postgres "$pgrx_data"
cargo pgrx test --release pg15 -p pg_ratelimit --runas postgres --pgdata "$pgrx_data"

step "build: SQLite extension and installed PostgreSQL extension"
cargo build --release -p sqlite_ratelimit
# The test cluster preloads the library: never overwrite the file under a running server.
bash scripts/pg_cluster.sh stop
cargo pgrx install -p pg_ratelimit --release --pg-config "$PG_CONFIG"
installed_release=1

step "client tests against both engines"
eval "$(bash scripts/pg_cluster.sh start)"
RL_REQUIRE_PG=1 "${PYTEST[@]}" -v tests
