#!/usr/bin/env bash
# The test suite.
#   bash scripts/test.sh             everything (what CI runs after the lint), as root on a fresh
#                                    Debian 12 machine with the Rust toolchain; installs what it
#                                    needs (scripts/setup.sh --pg), then
#                                    1. the core's tests; the SQLite extension and every package
#                                       built once (scripts/package.sh: one compile per PostgreSQL
#                                       major, whose package tree the tests install from);
#                                    2. for each major 15 to 18, a throwaway cluster of it: the
#                                       client suite against the native extension (with its in-server
#                                       checks, rl_self_test()), then against the SQL edition; the
#                                       suites that do not depend on the major
#                                       (SQLite, the packages, the web integrations, the quick
#                                       starts) on the first only;
#                                    3. on 15 also the SQL edition through pg_tle, and the SQL edition
#                                       on 13 and 14, each with a differential run against 15's
#                                       native extension;
#                                    4. on the last major, ratelimit-rls (Envoy's rate limit service,
#                                       built in the background) through Envoy's gRPC client;
#                                    5. the .deb and the tarball of every major as a user installs
#                                       them; Citus 13.2.2 on 15 and 14.0.1 on 18.
#   bash scripts/test.sh --fast      the core's tests and the SQLite client tests (not the
#                                    packages'): no root, no apt, no PostgreSQL; under a minute
#                                    once built.
#   bash scripts/test.sh --edition   the SQL edition on PostgreSQL 15 against the native extension:
#                                    its suite and a 10,000-call differential run (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTEST=(/usr/bin/python3 -m pytest -p no:cacheprovider)
step() { printf '\n\033[1m== [%s, %ds] %s\033[0m\n' "$(date +%T)" "$SECONDS" "$*"; }
# The suites every edition runs (the native pass runs all of tests/).
EDITION_SUITES=(tests/test_sql_edition.py tests/test_conformance.py tests/test_windows_and_leases.py tests/test_policies.py
                tests/test_postgres.py tests/test_take_all.py tests/test_fuzz.py tests/test_hostile.py tests/test_backup.py
                tests/test_platforms.py tests/test_budgets_near.py)

if [ "${1:-}" = "--fast" ]; then
  for need in cargo sqlite3 /usr/bin/python3; do
    command -v "$need" >/dev/null || { echo "needs $need: run bash scripts/setup.sh once as root" >&2; exit 1; }
  done
  /usr/bin/python3 -c 'import pytest' 2>/dev/null || { echo "needs python3-pytest: run bash scripts/setup.sh once as root" >&2; exit 1; }
  step "core: unit and property tests"
  cargo test -q -p ratelimit_core -p ratelimit_codegen
  step "build: SQLite extension"
  cargo build --release -p sqlite_ratelimit
  step "SQLite client tests (PostgreSQL ones skip)"
  env -u PGHOST -u RL_REQUIRE_PG RL_SKIP_PACKAGES=1 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" "${PYTEST[@]}" -q tests
  exit 0
fi

source scripts/pg_versions.sh
clusters=()
cleanup() {
  for c in "${clusters[@]}"; do
    RL_PG_BIN=${c%%=*} RL_PG_DIR=${c#*=} bash scripts/pg_cluster.sh stop
  done
}
trap cleanup EXIT

# A throwaway cluster of major $1 (folder /tmp/pg_ratelimit_cluster$1, port 543$1) preloading
# $2 (pg_ratelimit unless said); its settings exported for the client tests, the preload too, so a
# test that restarts the cluster (test_crash) preloads what this started and never a value inherited
# from the caller's shell.
cluster_start() {
  local v=$1
  export RL_PG_BIN RL_PG_DIR=/tmp/pg_ratelimit_cluster$v RL_PG_PORT=$((54300 + v)) PG_CONFIG
  export RL_PG_PRELOAD=${2-pg_ratelimit}
  RL_PG_BIN=$(pg_bin_of "$v")
  PG_CONFIG=$(pg_config_of "$v")
  clusters+=("$RL_PG_BIN=$RL_PG_DIR")
  eval "$(bash scripts/pg_cluster.sh start)"
}
cluster_stop() {
  RL_PG_BIN=$(pg_bin_of "$1") RL_PG_DIR=/tmp/pg_ratelimit_cluster$1 bash scripts/pg_cluster.sh stop
}

if [ "${1:-}" = "--edition" ]; then
  bash scripts/setup.sh --pg
  cargo build --quiet --release -p sqlite_ratelimit
  cluster_stop 15
  bash scripts/pg_install.sh 15 --build
  cluster_start 15
  step "postgres 15: the SQL edition against the native extension (10,000 random calls) and its suite"
  RL_PG_EDITION=sql RL_REQUIRE_PG=1 RL_SQLITE=0 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-5000}" "${PYTEST[@]}" -q \
    "${EDITION_SUITES[@]}"
  RL_REQUIRE_PG=1 RL_DIFF_CALLS="${RL_DIFF_CALLS:-10000}" "${PYTEST[@]}" -q tests/test_differential.py
  exit 0
fi

step "setup"
bash scripts/setup.sh --pg
# better-sqlite3 compiled once per machine and unpacked by every npm install that wants it
npm_config_better_sqlite3_local_prebuilds=$(bash scripts/better_sqlite3.sh)
export npm_config_better_sqlite3_local_prebuilds

step "core: unit and property tests"
cargo test -p ratelimit_core -p ratelimit_codegen

step "Rust: register(&conn) on an application's own rusqlite connection (its own build)"
cargo test -p sqlite_ratelimit --no-default-features

step "build: the SQLite extension, its packages and the web packages; PostgreSQL ${PG_VERSIONS[0]} (bash scripts/package.sh --sqlite, --pg ${PG_VERSIONS[0]})"
cargo build --release -p sqlite_ratelimit
bash scripts/package.sh --sqlite
bash scripts/package.sh --pg "${PG_VERSIONS[0]}"
# dist/ is built for this run: the suites read it and never build it again (nor does the
# build lane below, whose jobs write only their own files, each renamed into place)
export RL_DIST_BUILT=1
"$WEB_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall ./integrations/python

step "SQLite client tests as a SQLite user runs them: an unprivileged user, a Python with pytest alone (no psycopg2), no PostgreSQL"
# in a copy of the checkout that user owns (CI's clone may sit in a folder only root reads)
sqlite_only=$(mktemp -d /tmp/pg_ratelimit_sqlite_only.XXXXXX)
git ls-files -co --exclude-standard -z | grep -zv '^integrations/node/node_modules/' | xargs -0 cp --parents -t "$sqlite_only"
mkdir -p "$sqlite_only/target/release" && cp target/release/libratelimit.so "$sqlite_only/target/release/"
chown -R nobody "$sqlite_only"
(cd "$sqlite_only" && ! "$SQLITE_VENV/bin/python" -c 'import psycopg2' 2>/dev/null \
  && runuser -u nobody -- env -i PATH=/usr/bin:/bin HOME=/tmp RL_SKIP_PACKAGES=1 RL_FUZZ_CALLS=5000 \
       "$SQLITE_VENV/bin/python" -m pytest -p no:cacheprovider -q tests)
rm -rf "$sqlite_only"

# The build lane: the other majors (one compile each), pg_tle and Citus build in the
# background, at the lowest priority, while the first major's suites run in the foreground
# (they wait on servers and clients as much as they compute). Each job leaves a mark in
# $lane: <job>.done, or <job>.failed with its log beside it; lane_wait blocks on one.
lane=$(mktemp -d /tmp/pg_ratelimit_lane.XXXXXX)
lane_jobs=()
for v in "${PG_VERSIONS[@]:1}"; do lane_jobs+=("pg$v"); done
# (rls: ratelimit-rls in a target folder of its own, target/rls, so that its build of the
# SQLite crate, which links SQLite normally, never shares target/release/deps with the
# loadable extension)
lane_jobs+=(pg_tle rls citus15 citus18)
lane_script='
  for job in "$@"; do
    case "$job" in
      pg*[0-9]) run=(bash scripts/package.sh --pg "${job#pg}") ;;
      pg_tle) run=(bash -c "! bash scripts/pg_tle.sh available || bash scripts/pg_tle.sh build") ;;
      rls) run=(bash -c "export CARGO_TARGET_DIR=target/rls && cargo build --release -p ratelimit-rls && cargo test --release -p ratelimit-rls && bash scripts/package.sh --rls") ;;
      citus*) run=(env RL_CITUS_PG="${job#citus}" bash -c "! bash scripts/citus.sh available || bash scripts/citus.sh build") ;;
    esac
    if nice -n 19 "${run[@]}" >"$LANE/$job.log" 2>&1; then touch "$LANE/$job.done"; else touch "$LANE/$job.failed"; fi
  done'
# a session of its own, so that stopping the tests stops every compiler it started
LANE=$lane setsid bash -c "$lane_script" lane "${lane_jobs[@]}" &
lane_pid=$!
lane_wait() {
  local started=$SECONDS
  until [ -e "$lane/$1.done" ] || [ -e "$lane/$1.failed" ]; do
    kill -0 "$lane_pid" 2>/dev/null || { echo "the build lane stopped before $1" >&2; return 1; }
    sleep 2
  done
  [ $((SECONDS - started)) -lt 2 ] || echo "(waited $((SECONDS - started)) s for the build lane's $1)"
  if [ -e "$lane/$1.failed" ]; then
    echo "the build lane's $1 failed:" >&2
    tail -40 "$lane/$1.log" >&2
    return 1
  fi
}
trap 'kill -- -"$lane_pid" 2>/dev/null || true; cleanup' EXIT

first=${PG_VERSIONS[0]}
for v in "${PG_VERSIONS[@]}"; do
  [ "$v" = "$first" ] || lane_wait "pg$v"
  cluster_stop "$v"  # the cluster preloads the library: never overwrite it under a running server
  bash scripts/pg_install.sh "$v"
  cluster_start "$v"
  if [ "$v" = "$first" ]; then
    step "postgres $v: client tests of the native extension, with SQLite's and the packages' (once)"
    RL_REQUIRE_PG=1 RL_REQUIRE_PACKAGES=1 RL_DIFF_CALLS="${RL_DIFF_CALLS:-100000}" "${PYTEST[@]}" -v tests
    step "postgres $v: the web integrations (uvicorn, gunicorn, Django, Flask, Rack, Rails; real HTTP clients; SQLite's too)"
    RL_REQUIRE_RUBY=1 "$WEB_VENV/bin/python" -m pytest -p no:cacheprovider -v integrations/python/tests
    if [ -x "$DJANGO6_VENV/bin/python" ]; then
      step "postgres $v: Django 6 on Python $("$DJANGO6_VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') (gunicorn and uvicorn; PostgreSQL only: this Python cannot load SQLite extensions)"
      "$DJANGO6_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall ./integrations/python
      "$DJANGO6_VENV/bin/python" -m pytest -p no:cacheprovider -v -k "postgres and django" \
        integrations/python/tests/test_middleware.py integrations/python/tests/test_django.py
      step "the web package's SQLite paths on a Python that cannot load extensions ($("$DJANGO6_VENV/bin/python" --version)), through sqlean.py"
      RL_EXPECT_NO_LOAD_EXTENSION=1 "$DJANGO6_VENV/bin/python" -m pytest -p no:cacheprovider -v integrations/python/tests/test_pythons.py
    else
      echo "skipped: Django 6 (no Python 3.12 or later on this machine; see setup.sh)"
    fi
    step "postgres $v: the Node web integrations (Express, Fetch API, the Next.js 16 app; real HTTP clients; SQLite's too)"
    # package.sh installed integrations/node's own dependencies (npm ci)
    (cd integrations/node/examples/next-app && npm ci --no-audit --no-fund --loglevel=error) \
      && (cd integrations/node && npm test && npm run test:next)
  else
    step "postgres $v: client tests of the native extension (the major's own; SQLite's ran on $first)"
    RL_REQUIRE_PG=1 RL_SQLITE=0 RL_SKIP_PACKAGES=1 RL_DIFF_CALLS="${RL_DIFF_CALLS:-20000}" "${PYTEST[@]}" -v tests
  fi
  step "postgres $v: the SQL edition (installed from its plain script by an owner that is no superuser)"
  RL_PG_EDITION=sql RL_REQUIRE_PG=1 RL_SQLITE=0 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" "${PYTEST[@]}" -v "${EDITION_SUITES[@]}"
  if [ "$v" = 15 ]; then
    # the SQL edition on 13 and 14, beside 15's cluster, whose native extension the
    # differential run compares them with
    native=(RL_DIFF_NATIVE_HOST="$RL_PG_DIR" RL_DIFF_NATIVE_PORT="$RL_PG_PORT")
    for old in "${EDITION_ONLY_VERSIONS[@]}"; do
      step "postgres $old: the SQL edition (its suite, and a differential run against 15's native extension)"
      clusters+=("$(pg_bin_of "$old")=/tmp/pg_ratelimit_cluster$old")
      (cluster_start "$old" "" && RL_PG_EDITION=sql RL_REQUIRE_PG=1 RL_SQLITE=0 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" \
         "${PYTEST[@]}" -v "${EDITION_SUITES[@]}" \
       && env "${native[@]}" RL_REQUIRE_PG=1 RL_DIFF_CALLS="${RL_DIFF_CALLS_OLD:-20000}" "${PYTEST[@]}" -v tests/test_differential.py)
      cluster_stop "$old"
    done
    cluster_stop 15
    lane_wait pg_tle
    if bash scripts/pg_tle.sh available; then
      step "postgres $v: the SQL edition through pg_tle (pg_tle $(bash scripts/pg_tle.sh version), built from the vendor folder)"
      bash scripts/pg_tle.sh build
      cluster_start 15 pg_ratelimit,pg_tle
      RL_PG_EDITION=pg_tle RL_REQUIRE_PG=1 RL_SQLITE=0 RL_FUZZ_CALLS="${RL_FUZZ_CALLS:-20000}" "${PYTEST[@]}" -v \
        "${EDITION_SUITES[@]}"
    fi
  fi
  if [ "$v" = "${PG_VERSIONS[-1]}" ]; then
    lane_wait rls
    step "postgres $v: ratelimit-rls, Envoy's rate limit service, through Envoy's generated gRPC client (SQLite, the extension, the SQL edition)"
    "$WEB_VENV/bin/python" -m pytest -p no:cacheprovider -v rls/tests
  fi
  cluster_stop "$v"
done

step "postgres packages: the .deb and the tarball of each major, installed and tested"
bash scripts/test_system_packages.sh

# Citus 13.2.2 on 15 and 14.0.1 on 18 (the two Citus releases the vendor folder holds, on the
# oldest and newest majors each supports here), each built once per machine (citus.sh)
for major in 15 18; do
  step "Citus on PostgreSQL $major: a coordinator and two workers (RL_CITUS_PG=$major bash scripts/test_citus.sh)"
  lane_wait "citus$major"
  if RL_CITUS_PG=$major bash scripts/citus.sh available; then
    RL_CITUS_PG=$major bash scripts/test_citus.sh
  else
    echo "skipped: Citus is not installed for $major and its source tarball is not in $(vendor_dir) (set RL_CITUS_TARBALL)"
  fi
done
