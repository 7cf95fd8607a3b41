#!/usr/bin/env bash
# The PostgreSQL packages as a user installs them (as root, after scripts/package.sh), each
# over a server tree from which the files a `cargo pgrx install` put in place are removed,
# with the conformance suite run against a cluster using it; the release build is
# installed again afterwards, as before.
# - PostgreSQL 15: the .deb with dpkg -i; dpkg -r must leave none of its files behind.
# - PostgreSQL 18: the tarball's files copied where its INSTALL says.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
deb=dist/postgresql-15-pg-ratelimit_${version}_amd64.deb
[ -f "$deb" ] || { echo "no $deb: run bash scripts/package.sh" >&2; exit 1; }
mapfile -t files < <(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }')

export RL_PG_DIR=/tmp/pg_ratelimit_deb RL_PG_PORT=54331
cleanup() { bash scripts/pg_cluster.sh stop; }
trap cleanup EXIT
bash scripts/pg_cluster.sh stop
rm -f "${files[@]}"
dpkg -i "$deb" >/dev/null
for f in "${files[@]}"; do [ -e "$f" ] || { echo "dpkg -i did not install $f" >&2; exit 1; }; done
eval "$(bash scripts/pg_cluster.sh start)"
RL_REQUIRE_PG=1 /usr/bin/python3 -m pytest -p no:cacheprovider -q tests/test_conformance.py
bash scripts/pg_cluster.sh stop
dpkg -r postgresql-15-pg-ratelimit >/dev/null
for f in "${files[@]}"; do [ ! -e "$f" ] || { echo "dpkg -r left $f behind" >&2; exit 1; }; done
echo "deb: installed, conformance passed, removed without a trace (${#files[@]} files)"
CC=clang cargo pgrx install -p pg_ratelimit --release --pg-config /usr/lib/postgresql/15/bin/pg_config >/dev/null

pg18=$(pg_config_of 18)
tarball=dist/pg_ratelimit-${version}-pg18-linux-x86_64.tar.gz
[ -f "$tarball" ] || { echo "no $tarball: run bash scripts/package.sh" >&2; exit 1; }
export RL_PG_BIN RL_PG_DIR=/tmp/pg_ratelimit_tar RL_PG_PORT=54332 PG_CONFIG=$pg18
RL_PG_BIN=$(dirname "$pg18")
bash scripts/pg_cluster.sh stop
rm -f "$("$pg18" --pkglibdir)/pg_ratelimit.so" "$("$pg18" --sharedir)"/extension/pg_ratelimit*
unpacked=$(mktemp -d)
tar -xzf "$tarball" -C "$unpacked"
(cd "$unpacked"/pg_ratelimit-* && cp lib/pg_ratelimit.so "$("$pg18" --pkglibdir)/" && cp share/extension/* "$("$pg18" --sharedir)/extension/")
rm -rf "$unpacked"
eval "$(bash scripts/pg_cluster.sh start)"
RL_REQUIRE_PG=1 /usr/bin/python3 -m pytest -p no:cacheprovider -q tests/test_conformance.py
bash scripts/pg_cluster.sh stop
echo "PostgreSQL 18 tarball: installed as its INSTALL says, conformance passed"
CC=clang cargo pgrx install -p pg_ratelimit --release --pg-config "$pg18" --no-default-features --features pg18 >/dev/null
