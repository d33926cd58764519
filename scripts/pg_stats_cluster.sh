#!/usr/bin/env bash
# A PostgreSQL 15 cluster of the bench's own with pg_stat_statements loaded, for
# `jobcore bench e2e --pg-stats`: scripts/pg_stats_cluster.sh start|stop|drop|status|url.
#
#   PG_STATS_CLUSTER  the cluster's name (default jobcore_stats)
#   PG_STATS_PORT     where it listens on 127.0.0.1 (default 5451)
#
# pg_stat_statements needs shared_preload_libraries, which only a restart sets: the
# machine's shared cluster (15/main, 5432) is never reconfigured or restarted for it. This
# one is created with Debian's pg_createcluster and otherwise has the shared cluster's
# settings (/etc/postgresql/15/main/postgresql.conf and conf.d: shared_buffers 128MB,
# max_connections 100, fsync on, autovacuum off, WAL sizes), so a per-statement figure
# measured here matches what the shared server does. Trust authentication on 127.0.0.1
# only. `start` creates the cluster when missing and does nothing when it already answers
# (either way it prints the URL);
# `stop` stops it (the data stays), `drop` stops and deletes it. `url` prints the URL.
set -euo pipefail

version=15
name=${PG_STATS_CLUSTER:-jobcore_stats}
port=${PG_STATS_PORT:-5451}
conf=/etc/postgresql/$version/$name

usage() { echo "usage: $0 start|stop|drop|status|url" >&2; exit 2; }

answers() { pg_isready -q -h 127.0.0.1 -p "$port" -t 2 -U postgres; }

wait_answers() {
  for _ in $(seq 1 100); do
    answers && return 0
    sleep 0.1 # bounded: 10 s at most
  done
  answers
}

encoding() {
  psql -Atq -h 127.0.0.1 -p "$port" -U postgres -d postgres \
    -c "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = 'template1'"
}

exists() { [ -f "$conf/postgresql.conf" ]; }

create() {
  if [ "$name" = main ]; then
    echo "pg_stats_cluster: refusing to touch the shared cluster 'main'" >&2
    exit 1
  fi
  # --start-conf=manual: never started with the machine's services, only by this script.
  # UTF-8 as the shared cluster, whatever the caller's locale: created from a process
  # without LANG the cluster would be SQL_ASCII, whose text psycopg answers as bytes.
  pg_createcluster "$version" "$name" -p "$port" --start-conf=manual \
    --locale=C.UTF-8 --encoding=UTF8 -- --auth-local=trust --auth-host=trust >/dev/null
  cat >"$conf/conf.d/90-jobcore-stats.conf" <<EOF
# scripts/pg_stats_cluster.sh: the shared cluster's settings, and pg_stat_statements.
listen_addresses = '127.0.0.1'
port = $port
max_connections = 100
shared_buffers = 128MB
max_wal_size = 1GB
min_wal_size = 80MB
autovacuum = off
fsync = on
timezone = 'Etc/UTC'
log_timezone = 'Etc/UTC'
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
pg_stat_statements.max = 10000
pg_stat_statements.track_utility = on
# Block read/write times in pg_stat_statements (a clock read per block: small here).
track_io_timing = on
EOF
  # Trust on 127.0.0.1 only (pg_createcluster's --auth-host wrote the host lines).
  cat >"$conf/pg_hba.conf" <<EOF
local   all all                trust
host    all all 127.0.0.1/32   trust
EOF
}

case "${1:-}" in
  start)
    if answers && [ "$(encoding)" = UTF8 ]; then
      echo "postgresql://postgres@127.0.0.1:$port/postgres"
      exit 0
    fi
    # A cluster an earlier version of this script made without an encoding (SQL_ASCII
    # when its caller had no locale) is made again: it holds nothing but statistics.
    if answers || { exists && pg_ctlcluster "$version" "$name" start && wait_answers; }; then
      if [ "$(encoding)" != UTF8 ]; then
        pg_dropcluster "$version" "$name" --stop
        rm -rf "$conf" # pg_dropcluster leaves the conf.d file this script wrote
      fi
    fi
    exists || create
    answers || pg_ctlcluster "$version" "$name" start
    wait_answers || { echo "pg_stats_cluster: $name did not answer on $port" >&2; exit 1; }
    psql -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
      -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    if exists; then
      pg_ctlcluster "$version" "$name" stop || true
    fi
    ;;
  drop)
    if exists; then
      pg_dropcluster "$version" "$name" --stop
    fi
    rm -rf "$conf"
    ;;
  status)
    answers && echo "running on $port" || { echo "not running"; exit 1; }
    ;;
  url)
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
  *) usage ;;
esac
