#!/usr/bin/env bash
# Installs the extension of PostgreSQL major $1 from the package tree `cargo pgrx package`
# left in target/pg/release/pg_ratelimit-pgNN (scripts/package.sh builds it: one compile per
# major, reused by the tests, the packages and Citus), into the folders that server's
# pg_config names: what `cargo pgrx install` does, without compiling again.
#   scripts/pg_install.sh <major> [--build]   --build: compile the tree first when missing or stale
# Stop a server that preloads pg_ratelimit first: never overwrite a library a server has mapped.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
v=$1
pg_config=$(pg_config_of "$v")
target_dir=${RL_PG_TARGET_DIR:-target/pg}
tree=$target_dir/release/pg_ratelimit-pg$v
if [ "${2:-}" = "--build" ]; then
  CC=clang CARGO_TARGET_DIR=$target_dir cargo pgrx package -p pg_ratelimit --pg-config "$pg_config" --no-default-features --features "pg$v" >/dev/null
fi
libdir=$("$pg_config" --pkglibdir) sharedir=$("$pg_config" --sharedir)
library="$tree$libdir/pg_ratelimit.so"
[ -f "$library" ] || { echo "pg_install.sh: no $library: run bash scripts/package.sh (or pass --build)" >&2; exit 1; }
# written beside and renamed over, so a reader never sees half a file
install -m 755 "$library" "$libdir/.pg_ratelimit.so.new" && mv -f "$libdir/.pg_ratelimit.so.new" "$libdir/pg_ratelimit.so"
for f in "$tree$sharedir"/extension/pg_ratelimit*; do
  install -m 644 "$f" "$sharedir/extension/.${f##*/}.new" && mv -f "$sharedir/extension/.${f##*/}.new" "$sharedir/extension/${f##*/}"
done
