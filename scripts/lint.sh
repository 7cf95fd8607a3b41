#!/usr/bin/env bash
# Formatting and clippy (warnings are errors) on every crate; CI runs it before the tests.
# Each crate is linted in a cargo run of its own: the SQLite extension must not be unified
# with a crate that links SQLite normally, and pg_ratelimit builds through pgrx's setup.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n\033[1m== [%s, %ds] %s\033[0m\n' "$(date +%T)" "$SECONDS" "$*"; }
step "lint: cargo fmt --check"
cargo fmt --all --check
for crate in ratelimit_core ratelimit_codegen sqlite_ratelimit pg_ratelimit ratelimit-rls; do
  step "lint: clippy -p $crate"
  cargo clippy -q -p "$crate" --all-targets -- -D warnings
done
step "lint: clippy -p sqlite_ratelimit --no-default-features (register(&conn))"
cargo clippy -q -p sqlite_ratelimit --no-default-features --all-targets -- -D warnings
