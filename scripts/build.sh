#!/usr/bin/env bash
# Builds the SQLite extension (release) and installs the PostgreSQL extension (release)
# into the system PostgreSQL 15. Expects scripts/setup.sh --pg (or --bench) to have run.
# Stop a server that preloads pg_ratelimit first: the install overwrites the library file
# that server has mapped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release -p sqlite_ratelimit
cargo pgrx install -p pg_ratelimit --release --pg-config /usr/lib/postgresql/15/bin/pg_config >/dev/null
