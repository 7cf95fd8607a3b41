#!/usr/bin/env bash
# Builds redis-cell 0.2.2 (the Redis module with CL.THROTTLE, the fastest peer the benchmarks
# compare with) from crates.io into /opt/pg_ratelimit/redis-cell, once; prints the module's path.
# Its dependencies are pinned by bench/redis_cell.Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.2.2
dest=/opt/pg_ratelimit/redis-cell/$version/libredis_cell.so
if [ ! -f "$dest" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # cargo fetches the crate's source into its registry through a throwaway manifest
  cargo new -q --lib "$work/fetch"
  echo "redis-cell = \"=$version\"" >> "$work/fetch/Cargo.toml"  # under its [dependencies]
  cargo fetch -q --manifest-path "$work/fetch/Cargo.toml"
  src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-cell-$version | head -1)
  cp -r "$src" "$work/build"
  cp bench/redis_cell.Cargo.lock "$work/build/Cargo.lock"
  # its code predates some of today's lints: the warnings go to a log, not the terminal
  (cd "$work/build" && cargo build -q --release --locked 2> "$work/build.log") || { cat "$work/build.log" >&2; exit 1; }
  install -D -m 0755 "$work/build/target/release/libredis_cell.so" "$dest"  # Redis loads only an executable module
fi
echo "$dest"
