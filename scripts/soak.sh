#!/usr/bin/env bash
# Longer run (a few minutes): 1,000,000 keys, then a batched sweep, on both engines.
# Figures go to bench/results/soak.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --pg
bash scripts/build.sh
export RL_PG_DIR=/tmp/pg_ratelimit_soak RL_PG_PORT=54331
trap 'bash scripts/pg_cluster.sh stop' EXIT
eval "$(bash scripts/pg_cluster.sh start)"
/usr/bin/python3 bench/soak.py
