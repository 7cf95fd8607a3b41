#!/usr/bin/env bash
# rl_take calls/s through a Citus coordinator (scripts/citus.sh: a coordinator and two
# workers on this machine) next to the same coordinator with its tables undistributed:
# pgbench, 8 clients, 100,000 keys, RL_BENCH_REPS runs of RL_BENCH_SECONDS per cell,
# interleaved; medians into bench/results/citus.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=${RL_BENCH_SECONDS:-5}
REPS=${RL_BENCH_REPS:-3}
bash scripts/citus.sh stop
trap 'bash scripts/citus.sh stop' EXIT
eval "$(bash scripts/citus.sh start)"
as_pg() { runuser -u postgres -- "$@"; }
sql() { as_pg psql -X -q -v ON_ERROR_STOP=1 -h "$PGHOST" -p "$PGPORT" -d "$PGDATABASE" -Atc "$1"; }
work=$(mktemp -d /tmp/rl_citus_bench.XXXXXX)
chmod 755 "$work"
# one call as its own statement (delegated when distributed), and the same call inside a
# transaction block (never delegated: it runs through the coordinator)
take="SELECT rl_take('k' || :k, 1000000000, 600000000);"
printf '\\set k random(1, 100000)\n%s\n' "$take" >"$work/constant.sql"
printf '\\set k random(1, 100000)\nBEGIN;\n%s\nCOMMIT;\n' "$take" >"$work/block.sql"
run() {  # run SCRIPT -> calls/s
  as_pg pgbench -n -M simple -c 8 -j 2 -T "$SECONDS_PER" -h "$PGHOST" -p "$PGPORT" -f "$1" "$PGDATABASE" 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
sql "CREATE EXTENSION pg_ratelimit"
for port in "$PGPORT" $((PGPORT + 1)) $((PGPORT + 2)); do
  as_pg psql -X -q -h "$PGHOST" -p "$port" -d "$PGDATABASE" -c "ALTER SYSTEM SET synchronous_commit = off" \
    -c "SELECT pg_reload_conf()" >/dev/null
done
sql "INSERT INTO ratelimit.rl_bucket SELECT 'k' || g, 1000000000, 0, 0 FROM generate_series(1, 100000) g"
one_node=()
for _ in $(seq "$REPS"); do one_node+=("$(run "$work/constant.sql")"); done
block=$(python3 -c "import re; r=open('docs/guides/operations.md').read(); s=r[r.index('## More than one server'):]; print(re.search(r'\`\`\`plpgsql\n(.*?)\`\`\`', s, re.S).group(1))")
as_pg psql -X -q -v ON_ERROR_STOP=1 -h "$PGHOST" -p "$PGPORT" -d "$PGDATABASE" -c "$block" >/dev/null
delegated=() coordinated=()
for _ in $(seq "$REPS"); do
  delegated+=("$(run "$work/constant.sql")")
  coordinated+=("$(run "$work/block.sql")")
done
rm -rf "$work"
base=$(median "${one_node[@]}")
row() { awk -v n="$2" -v b="$base" -v what="$1" 'BEGIN {printf "| %s | %d | %.2fx |\n", what, n, n / b}'; }
{
  echo "# rl_take through a Citus coordinator"
  echo
  echo "\`bash bench/citus.sh\` (RL_BENCH_REPS=$REPS, RL_BENCH_SECONDS=$SECONDS_PER): Citus 13.2.2, PostgreSQL 15, a coordinator and two workers on one 2-core machine; pgbench, 8 clients, simple protocol, 100,000 keys, synchronous_commit off, medians. The first row is the same coordinator before its tables are distributed."
  echo
  echo "| rl_take | calls/s | next to one node |"
  echo "|---|---|---|"
  row "one node (tables on the coordinator)" "$base"
  row "sharded, delegated to the key's worker" "$(median "${delegated[@]}")"
  row "sharded, run through the coordinator (in a transaction block)" "$(median "${coordinated[@]}")"
} >bench/results/citus.md
cat bench/results/citus.md
