#!/usr/bin/env bash
# A throwaway PostgreSQL cluster (15 unless RL_PG_BIN names another bin folder) for client
# tests on a private port and socket folder,
# with pg_ratelimit preloaded (its memory store exists; the table store stays the default;
# RL_PG_PRELOAD names other libraries to preload instead, e.g. "pg_ratelimit,pg_tle", or none: ""),
# run as the postgres user when called as root (initdb and postgres refuse to run as
# root), else as the calling user.
#   scripts/pg_cluster.sh start   create if missing, start if stopped (recovering after a
#                                 crash); prints the connection settings to eval
#   scripts/pg_cluster.sh crash   kill -9 the postmaster and every backend (tests only)
#   scripts/pg_cluster.sh stop    stop and delete the cluster
set -euo pipefail
BIN=${RL_PG_BIN:-/usr/lib/postgresql/15/bin}
DIR=${RL_PG_DIR:-/tmp/pg_ratelimit_cluster}
PORT=${RL_PG_PORT:-54329}
if [ "$(id -u)" = 0 ]; then
  as_pg() { runuser -u postgres -- "$@"; }
  owner=postgres
else
  as_pg() { "$@"; }
  owner=$(id -un)
fi
running() { as_pg "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if [ ! -d "$DIR/data" ]; then
      mkdir -p "$DIR"
      chown "$owner" "$DIR"
      as_pg "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log"
    fi
    if ! running; then
      as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 120 \
        -o "-p $PORT -k $DIR -c listen_addresses='' -c max_connections=120 -c shared_preload_libraries=${RL_PG_PRELOAD-pg_ratelimit}" start >/dev/null
    fi
    echo "export PGHOST=$DIR PGPORT=$PORT PGUSER=postgres RL_PG_DIR=$DIR"
    ;;
  crash)
    pm=$(head -n 1 "$DIR/data/postmaster.pid")
    children=$(pgrep -P "$pm" || true)
    kill -9 "$pm" $children
    # wait until every process of the cluster is gone, as after a power cut
    for _ in $(seq 100); do
      kill -0 "$pm" 2>/dev/null || [ -n "$(for c in $children; do kill -0 "$c" 2>/dev/null && echo alive; done)" ] || break
      sleep 0.1
    done
    ;;
  stop)
    if [ -d "$DIR/data" ] && running; then
      as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"
    ;;
  *)
    echo "usage: $0 start|crash|stop" >&2; exit 2 ;;
esac
