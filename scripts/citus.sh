#!/usr/bin/env bash
# A Citus test cluster on one machine: a coordinator and two workers of PostgreSQL
# $RL_CITUS_PG (15 unless set; 18 too) on private ports and one socket folder, run as the
# postgres user, with citus and pg_ratelimit preloaded (explicit clocks allowed, for the
# conformance list). Test-only: Citus is built from the tarball in the vendor folder
# (pg_versions.sh's vendor_dir: ../shared/vendor; RL_CITUS_TARBALL) and never ships with
# the project: 13.2.2 for 15 (it supports 15 to 17), 14.0.1 for 18 (it supports 16 to 18),
# each with citus/function_call_delegation.patch.
#   scripts/citus.sh build   install that Citus into that PostgreSQL (skipped when present)
#   scripts/citus.sh start   build if needed, create the three nodes if missing, start them,
#                            join the workers; prints the coordinator's settings to eval
#   scripts/citus.sh stop    stop the nodes and delete them
#   scripts/citus.sh available  succeeds when Citus is installed or its tarball is at hand
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
PG_MAJOR=${RL_CITUS_PG:-15}
case "$PG_MAJOR" in
  15) VERSION=13.2.2 SHA256=dd2453caec20a830e5e63f1def5c5a98cb6f57ae510407cdcd800916fcdab430 ;;
  18) VERSION=14.0.1 SHA256=acfa9a77cd84a8e1edab26cca4a71355f39c910c01586da89560e0240d4b05ba ;;
  *) echo "citus.sh: no Citus build arranged for PostgreSQL $PG_MAJOR (15 or 18)" >&2; exit 2 ;;
esac
PG_CONFIG=$(pg_config_of "$PG_MAJOR")
BIN=$(dirname "$PG_CONFIG")
TARBALL=${RL_CITUS_TARBALL:-$(vendor_dir)/citus-$VERSION.tar.gz}
DIR=${RL_CITUS_DIR:-/tmp/pg_ratelimit_citus}
PORT=${RL_CITUS_PORT:-54340}   # coordinator; workers on the next two ports
DB=${RL_CITUS_DB:-rl}
NODES="coordinator:$PORT worker1:$((PORT + 1)) worker2:$((PORT + 2))"
log() { printf '\033[1m[citus]\033[0m %s\n' "$*" >&2; }
as_pg() { runuser -u postgres -- "$@"; }

# The project's fix of Citus's function call delegation (citus/function_call_delegation.patch),
# applied to the copy it builds; the build records which patch it has.
PATCH=$(pwd)/citus/function_call_delegation.patch
PATCH_MARK="$($PG_CONFIG --sharedir)/extension/citus.pg_ratelimit-patch"
patch_sum() { sha256sum "$PATCH" | cut -d' ' -f1; }

installed() {
  local lib
  lib=$("$PG_CONFIG" --pkglibdir)/citus.so
  [ -f "$lib" ] && grep -q "default_version = '${VERSION%.*}" "$($PG_CONFIG --sharedir)/extension/citus.control" 2>/dev/null \
    && [ "$(cat "$PATCH_MARK" 2>/dev/null)" = "$(patch_sum)" ]
}

# What a build installs, kept once per machine under a name made of the checksums of the
# tarball, the patch and the server's headers, so that a server tree set up again (setup.sh)
# gets the same build back without compiling it: /opt/pg_ratelimit/cache/citus-....tar.gz
cache_file() {
  local key
  key=$(cat "$TARBALL" "$PATCH" "$("$PG_CONFIG" --includedir-server)/pg_config.h" 2>/dev/null | sha256sum | cut -c1-16)
  echo "/opt/pg_ratelimit/cache/citus-$VERSION-pg$PG_MAJOR-$key.tar.gz"
}

# The files of a Citus install: its library and bitcode, and its extension files.
citus_files() {
  local lib share
  lib=$("$PG_CONFIG" --pkglibdir) share=$("$PG_CONFIG" --sharedir)
  find "$lib" -maxdepth 1 -name 'citus*' -print
  [ ! -d "$lib/bitcode" ] || find "$lib/bitcode" -maxdepth 1 -name 'citus*' -print
  find "$share/extension" -maxdepth 1 -name 'citus*' -print
}

build() {
  if installed; then
    log "Citus $VERSION already installed for PostgreSQL $PG_MAJOR"
    return
  fi
  local cached
  cached=$(cache_file)
  if [ -f "$cached" ]; then
    log "Citus $VERSION for PostgreSQL $PG_MAJOR from the cache ($cached)"
    tar -xzf "$cached" -C /
    installed && return
    log "the cached build did not install; building again"
  fi
  local missing=() pkg
  for pkg in postgresql-15 postgresql-server-dev-15 build-essential patch clang liblz4-dev libzstd-dev libcurl4-openssl-dev \
      libkrb5-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  echo "$SHA256  $TARBALL" | sha256sum -c --quiet -
  local src
  src=$(mktemp -d /tmp/citus-build.XXXXXX)
  tar -xzf "$TARBALL" -C "$src"
  src=$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -n 1)
  # Debian's 15.20 headers declare have_createdb_privilege(); Citus's own shim of it then
  # clashes. Drop the shim from this unpacked copy (see ../shared/vendor/README.md).
  python3 - "$src/src/include/pg_version_compat.h" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
shim = re.compile(r"static inline bool\s*\nhave_createdb_privilege\(void\)\s*\n\{.*?\n\}\n", re.S)
text, n = shim.subn("", text, count=1)
if n != 1 and "have_createdb_privilege" in text:
    sys.exit("citus.sh: the have_createdb_privilege shim was not found where expected")
open(path, "w").write(text)
PY
  (cd "$src" && patch -s -p1 < "$PATCH")
  log "building Citus $VERSION for PostgreSQL $PG_MAJOR (with citus/function_call_delegation.patch)"
  # clang: 18 was compiled with GCC 14, whose warning flags Debian's gcc 12 rejects
  local cc=gcc
  [ "$PG_MAJOR" = 15 ] || cc=clang
  (cd "$src" && ./configure -q CC="$cc" PG_CONFIG="$PG_CONFIG" >/dev/null && make -s -j"$(nproc)" CC="$cc" >/dev/null \
    && make -s install CC="$cc" >/dev/null)
  rm -rf "$(dirname "$src")"
  patch_sum > "$PATCH_MARK"
  installed || { log "Citus did not install"; exit 1; }
  mkdir -p "$(dirname "$cached")"
  citus_files | sed 's|^/||' | tar -czf "$cached.tmp" -C / -T - && mv "$cached.tmp" "$cached"
}

psql_on() { as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR" -p "$1" "${@:2}"; }

start() {
  build
  mkdir -p "$DIR"
  chown postgres "$DIR"
  local node name port
  for node in $NODES; do
    name=${node%%:*}
    port=${node##*:}
    if [ ! -d "$DIR/$name" ]; then
      as_pg "$BIN/initdb" -D "$DIR/$name" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$DIR/$name.initdb.log"
    fi
    if ! as_pg "$BIN/pg_ctl" -D "$DIR/$name" status >/dev/null 2>&1; then
      as_pg "$BIN/pg_ctl" -D "$DIR/$name" -l "$DIR/$name.log" -w -t 120 -o "-p $port -k $DIR \
        -c listen_addresses='' -c max_connections=200 -c shared_preload_libraries=citus,pg_ratelimit \
        -c pg_ratelimit.allow_explicit_clock=on" start >/dev/null
    fi
    if [ -z "$(psql_on "$port" -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
      psql_on "$port" -d postgres -c "CREATE DATABASE $DB"
      psql_on "$port" -d "$DB" -c "CREATE EXTENSION citus"
    fi
  done
  if [ "$(psql_on "$PORT" -d "$DB" -Atc "SELECT count(*) FROM pg_dist_node")" -lt 3 ]; then
    psql_on "$PORT" -d "$DB" -c "SELECT citus_set_coordinator_host('$DIR', $PORT)" \
      -c "SELECT citus_add_node('$DIR', $((PORT + 1)))" -c "SELECT citus_add_node('$DIR', $((PORT + 2)))" >/dev/null
  fi
  echo "export PGHOST=$DIR PGPORT=$PORT PGUSER=postgres PGDATABASE=$DB RL_CITUS_DIR=$DIR RL_PG_BIN=$BIN"
}

stop() {
  local node name
  for node in $NODES; do
    name=${node%%:*}
    if [ -d "$DIR/$name" ]; then
      as_pg "$BIN/pg_ctl" -D "$DIR/$name" -m fast -w stop >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$DIR"
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  stop) stop ;;
  available) installed || [ -f "$TARBALL" ] ;;
  *) echo "usage: $0 build|start|stop|available" >&2; exit 2 ;;
esac
