#!/usr/bin/env bash
# The Citus tests (tests/test_citus.py) on a throwaway coordinator and two workers of
# PostgreSQL $RL_CITUS_PG (15 unless set; 18 too, see citus.sh): builds Citus and the
# extension if needed, starts the cluster, runs the tests, stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
major=${RL_CITUS_PG:-15}
bash scripts/setup.sh --pg
bash scripts/citus.sh stop
cargo build --quiet --release -p sqlite_ratelimit
# the package tree scripts/package.sh built (compiled here only when it is missing or stale)
bash scripts/pg_install.sh "$major" --build
trap 'bash scripts/citus.sh stop' EXIT
eval "$(bash scripts/citus.sh start)"
RL_CITUS=1 /usr/bin/python3 -m pytest -p no:cacheprovider -v tests/test_citus.py
