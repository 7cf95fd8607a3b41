#!/usr/bin/env bash
# The test suite.
#   bash scripts/test.sh          everything, as root on a fresh Debian 12 machine: installs what it
#                                 needs (apt packages, cargo-pgrx, PostgreSQL 15, 16, 17 and 18), runs the
#                                 core's tests, then for each PostgreSQL version in turn the in-server
#                                 pgrx tests and the client tests of both built extensions against a
#                                 throwaway cluster of that version (and the PostgreSQL tests again
#                                 against the SQL edition), the packages of every major, then
#                                 the Citus target (scripts/test_citus.sh) on 15 and on 18 when
#                                 Citus or its source tarball is at hand. CI runs this.
#   bash scripts/test.sh --fast   the core's tests and the SQLite client tests: no root, no apt, no
#                                 PostgreSQL; under a minute once built. Needs cargo, sqlite3 and
#                                 Debian's python3 with pytest (scripts/setup.sh installs them once).
set -euo pipefail
cd "$(dirname "$0")/.."
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

step "Rust: register(&conn) on an application's own rusqlite connection (its own build)"
cargo test -p sqlite_ratelimit --no-default-features

step "build: SQLite extension; packages (bash scripts/package.sh)"
cargo build --release -p sqlite_ratelimit
bash scripts/package.sh

source scripts/pg_versions.sh
step "the Python web package (integrations/python) into $WEB_VENV: examples/service.py runs on it"
"$WEB_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall ./integrations/python

# Each PostgreSQL version's cluster and pgrx data folder, stopped and removed whatever happens;
# if the in-server tests stopped the run, their test build is still installed: put the
# release build back.
pending_release=
cleanup() {
  [ -z "$pending_release" ] || CC=clang cargo pgrx install -p pg_ratelimit --release --no-default-features \
    --features "pg$pending_release" --pg-config "$(pg_config_of "$pending_release")" >/dev/null
  for v in "${PG_VERSIONS[@]}"; do
    RL_PG_BIN=$(dirname "$(pg_config_of "$v")") RL_PG_DIR=/tmp/pg_ratelimit_cluster$v bash scripts/pg_cluster.sh stop
  done
  rm -rf /tmp/pg_ratelimit_pgrx.*
}
trap cleanup EXIT

# For each version: the in-server tests, then the release build installed (replacing the
# test build the pgrx tests install) and the whole client suite against a cluster of that
# version (the SQLite tests, which do not depend on it, run each time too).
for v in "${PG_VERSIONS[@]}"; do
  pg_config=$(pg_config_of "$v")
  export RL_PG_BIN RL_PG_DIR=/tmp/pg_ratelimit_cluster$v RL_PG_PORT=$((54300 + v)) PG_CONFIG=$pg_config
  RL_PG_BIN=$(dirname "$pg_config")
  step "postgres $v: in-server tests (cargo pgrx test --release)"
  pgrx_data=$(mktemp -d /tmp/pg_ratelimit_pgrx.XXXXXX)
  chown postgres:postgres "$pgrx_data"
  # The cluster preloads the library: never overwrite the file under a running server.
  bash scripts/pg_cluster.sh stop
  pending_release=$v
  CC=clang cargo pgrx test --release "pg$v" -p pg_ratelimit --runas postgres --pgdata "$pgrx_data"
  CC=clang cargo pgrx install -p pg_ratelimit --release --pg-config "$pg_config" --no-default-features --features "pg$v"
  pending_release=

  step "postgres $v: client tests (with SQLite's)"
  eval "$(bash scripts/pg_cluster.sh start)"
  first=$([ "$v" = "${PG_VERSIONS[0]}" ] && echo 1 || echo 0)
  # the differential run (native against the SQL edition): 100,000 calls on the first version
  RL_REQUIRE_PG=1 RL_REQUIRE_PACKAGES=$first RL_SKIP_PACKAGES=$((1 - first)) \
    RL_DIFF_CALLS="${RL_DIFF_CALLS:-$([ "$first" = 1 ] && echo 100000 || echo 20000)}" "${PYTEST[@]}" -v tests
  if [ "$first" = 1 ]; then
    step "postgres $v: the web integrations (uvicorn, real HTTP clients; SQLite's too)"
    RL_REQUIRE_RUBY=1 "$WEB_VENV/bin/python" -m pytest -p no:cacheprovider -v integrations/python/tests
    if [ -x "$DJANGO6_VENV/bin/python" ]; then
      step "postgres $v: Django 6 on Python $("$DJANGO6_VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') (gunicorn and uvicorn; PostgreSQL only: this Python cannot load SQLite extensions)"
      "$DJANGO6_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall ./integrations/python
      "$DJANGO6_VENV/bin/python" -m pytest -p no:cacheprovider -v -k "postgres and django" \
        integrations/python/tests/test_middleware.py integrations/python/tests/test_django.py
    else
      echo "skipped: Django 6 (no Python 3.12 or later on this machine; see setup.sh)"
    fi
    step "postgres $v: the Node web integrations (Express, Fetch API; real HTTP clients; SQLite's too)"
    # better-sqlite3 builds against the local Node headers (no download)
    (cd integrations/node && { [ ! -d /usr/include/node ] || export npm_config_nodedir=/usr; } \
      && npm ci --no-audit --no-fund --loglevel=error && npm test)
    step "postgres $v: the Next.js 16 app (next build, next start; proxy.ts and route handlers; SQLite's too)"
    (cd integrations/node/examples/next-app && { [ ! -d /usr/include/node ] || export npm_config_nodedir=/usr; } \
      && npm ci --no-audit --no-fund --loglevel=error) && (cd integrations/node && npm run test:next)
  fi
  step "postgres $v: the SQL edition (installed from its plain script by an owner that is no superuser)"
  RL_PG_EDITION=sql RL_REQUIRE_PG=1 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" "${PYTEST[@]}" -v tests/test_sql_edition.py \
    tests/test_conformance.py tests/test_windows_and_leases.py tests/test_policies.py tests/test_postgres.py \
    tests/test_take_all.py tests/test_fuzz.py tests/test_hostile.py tests/test_backup.py
  bash scripts/pg_cluster.sh stop
  if [ "$v" = 15 ] && bash scripts/pg_tle.sh available; then
    step "postgres $v: the SQL edition through pg_tle (pg_tle $(bash scripts/pg_tle.sh version) built from ../shared/vendor)"
    bash scripts/pg_tle.sh build
    eval "$(RL_PG_PRELOAD=pg_ratelimit,pg_tle bash scripts/pg_cluster.sh start)"
    RL_PG_EDITION=pg_tle RL_REQUIRE_PG=1 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" "${PYTEST[@]}" -v \
      tests/test_sql_edition.py tests/test_conformance.py tests/test_windows_and_leases.py tests/test_policies.py \
      tests/test_postgres.py tests/test_take_all.py tests/test_fuzz.py tests/test_hostile.py tests/test_backup.py
    bash scripts/pg_cluster.sh stop
  fi
done

step "postgres packages: the .deb and the tarball of each major, installed and tested"
bash scripts/test_system_packages.sh

# Citus 13.2.2 on 15 and 14.0.1 on 18 (the two Citus releases the vendor folder holds, on the
# oldest and newest majors each supports here)
for major in 15 18; do
  step "Citus on PostgreSQL $major: a coordinator and two workers (RL_CITUS_PG=$major bash scripts/test_citus.sh)"
  if RL_CITUS_PG=$major bash scripts/citus.sh available; then
    RL_CITUS_PG=$major bash scripts/test_citus.sh
  else
    echo "skipped: Citus is not installed for $major and its source tarball is not in ../shared/vendor (set RL_CITUS_TARBALL)"
  fi
done
