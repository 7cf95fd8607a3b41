#!/usr/bin/env bash
# The main job: build the SQLite extension and show rate limiting on SQLite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --quiet --release -p sqlite_ratelimit
sqlite3 :memory: -cmd ".load target/release/libratelimit" < examples/demo.sql
