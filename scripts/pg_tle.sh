#!/usr/bin/env bash
# pg_tle (Trusted Language Extensions, as Amazon RDS, Aurora and Supabase offer it), built
# into PostgreSQL 15 from the tarball in the vendor folder (pg_versions.sh's vendor_dir;
# RL_PG_TLE_TARBALL) so that the
# SQL edition's pg_tle install path is tested. Test-only: pg_tle never ships with the project.
#   scripts/pg_tle.sh build       install pg_tle 1.5.3 into PostgreSQL 15 (skipped when present)
#   scripts/pg_tle.sh available   succeeds when pg_tle is installed or its tarball is at hand
#   scripts/pg_tle.sh version     the version it builds
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
VERSION=1.5.3
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
TARBALL=${RL_PG_TLE_TARBALL:-$(vendor_dir)/pg_tle-$VERSION.tar.gz}
SHA256=be6691479b260ea630c69338cfe95727d0ca4ebf2f23f3f58bb8b65f040aa0bb
log() { printf '\033[1m[pg_tle]\033[0m %s\n' "$*" >&2; }

installed() {
  [ -f "$("$PG_CONFIG" --pkglibdir)/pg_tle.so" ] \
    && grep -q "default_version = '$VERSION'" "$("$PG_CONFIG" --sharedir)/extension/pg_tle.control" 2>/dev/null
}

case "${1:-}" in
  version)
    echo "$VERSION"
    ;;
  available)
    installed || [ -f "$TARBALL" ]
    ;;
  build)
    if installed; then
      log "pg_tle $VERSION already installed for PostgreSQL 15"
      exit 0
    fi
    # the server headers include gssapi/gssapi.h
    for pkg in postgresql-server-dev-15 build-essential libkrb5-dev; do
      if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed"; then
        log "apt-get install $pkg"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$pkg" >/dev/null
      fi
    done
    echo "$SHA256  $TARBALL" | sha256sum -c --quiet -
    src=$(mktemp -d /tmp/pg_tle-build.XXXXXX)
    trap 'rm -rf "$src"' EXIT
    tar -xzf "$TARBALL" -C "$src"
    dir=$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -n 1)
    log "building pg_tle $VERSION for PostgreSQL 15 (under a minute)"
    make -s -C "$dir" USE_PGXS=1 PG_CONFIG="$PG_CONFIG" >/dev/null
    make -s -C "$dir" USE_PGXS=1 PG_CONFIG="$PG_CONFIG" install >/dev/null
    ;;
  *)
    echo "usage: $0 build|available" >&2
    exit 2
    ;;
esac
