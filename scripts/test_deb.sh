#!/usr/bin/env bash
# The Debian package as a user installs it (as root, after scripts/package.sh): the files a
# `cargo pgrx install` put in place are removed, the .deb installed with dpkg, the
# conformance suite run against a cluster using it, and `dpkg -r` must leave none of its
# files behind. The release build is installed again at the end, as before.
set -euo pipefail
cd "$(dirname "$0")/.."
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
cargo pgrx install -p pg_ratelimit --release --pg-config /usr/lib/postgresql/15/bin/pg_config >/dev/null
