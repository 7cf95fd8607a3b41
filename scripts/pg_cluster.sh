#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for client tests, run as the postgres user on a
# private port and socket folder (initdb and postgres refuse to run as root).
#   scripts/pg_cluster.sh start   -> prints the connection settings to export
#   scripts/pg_cluster.sh stop
set -euo pipefail
BIN=/usr/lib/postgresql/15/bin
DIR=${RL_PG_DIR:-/tmp/pg_ratelimit_cluster}
PORT=${RL_PG_PORT:-54329}
as_pg() { runuser -u postgres -- "$@"; }

case "${1:-}" in
  start)
    if [ -f "$DIR/data/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
      : # already running
    else
      rm -rf "$DIR"
      mkdir -p "$DIR"
      chown postgres:postgres "$DIR"
      as_pg "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log"
      as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
        -o "-p $PORT -k $DIR -c listen_addresses='' -c max_connections=120 -c fsync=${RL_PG_FSYNC:-on}" start >/dev/null
    fi
    echo "export PGHOST=$DIR PGPORT=$PORT PGUSER=postgres"
    ;;
  stop)
    if [ -d "$DIR/data" ]; then
      as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    ;;
  *)
    echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
