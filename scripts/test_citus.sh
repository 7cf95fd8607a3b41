#!/usr/bin/env bash
# The Citus tests (tests/test_citus.py) on a throwaway coordinator and two workers:
# builds Citus and the extension if needed, starts the cluster, runs the tests, stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --pg
bash scripts/build.sh
bash scripts/citus.sh stop
trap 'bash scripts/citus.sh stop' EXIT
eval "$(bash scripts/citus.sh start)"
RL_CITUS=1 /usr/bin/python3 -m pytest -p no:cacheprovider -v tests/test_citus.py
