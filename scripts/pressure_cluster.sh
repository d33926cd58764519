#!/usr/bin/env bash
# The PostgreSQL 15 cluster of `jobcore bench pressure`: scripts/pressure_cluster.sh
# start|stop|restart|drop|status|url.
#
#   PRESSURE_CLUSTER  the cluster's name (default pressure)
#   PRESSURE_PORT     where it listens on 127.0.0.1 (default 5460)
#
# The pressure scenario pins the xmin horizon, kills backends, fills every connection slot
# and restarts PostgreSQL: none of that may touch the machine's shared cluster (15/main,
# 5432), so it runs on a cluster of its own, made with Debian's pg_createcluster. Unlike
# the shared CI cluster it runs autovacuum with its defaults, as a production server does
# (a pinned horizon's cost is what autovacuum cannot reclaim), and it preloads
# pg_stat_statements (which statements suffer) and has pgstattuple (exact dead tuples),
# both from PostgreSQL's contrib, which Debian's postgresql-15 package ships.
# Trust authentication on 127.0.0.1 only. `start` creates the cluster when missing and
# does nothing when it already answers (either way it prints the URL); `restart` is the
# scenario's PostgreSQL restart; `stop` stops it (the data stays); `drop` deletes it.
set -euo pipefail

version=15
name=${PRESSURE_CLUSTER:-pressure}
port=${PRESSURE_PORT:-5460}
conf=/etc/postgresql/$version/$name

usage() { echo "usage: $0 start|stop|restart|drop|status|url" >&2; exit 2; }

answers() { pg_isready -q -h 127.0.0.1 -p "$port" -t 2 -U postgres; }

wait_answers() {
  for _ in $(seq 1 300); do
    answers && return 0
    sleep 0.1 # bounded: 30 s at most
  done
  answers
}

exists() { [ -f "$conf/postgresql.conf" ]; }

url() { echo "postgresql://postgres@127.0.0.1:$port/postgres"; }

create() {
  if [ "$name" = main ]; then
    echo "pressure_cluster: refusing to touch the shared cluster 'main'" >&2
    exit 1
  fi
  # --start-conf=manual: never started with the machine's services, only by this script.
  pg_createcluster "$version" "$name" -p "$port" --start-conf=manual \
    --locale=C.UTF-8 --encoding=UTF8 -- --auth-local=trust --auth-host=trust >/dev/null
  cat >"$conf/conf.d/90-jobcore-pressure.conf" <<CONF
# scripts/pressure_cluster.sh: production-like vacuuming, and the statistics extensions.
listen_addresses = '127.0.0.1'
port = $port
max_connections = 100
superuser_reserved_connections = 3
shared_buffers = 128MB
max_wal_size = 1GB
min_wal_size = 80MB
fsync = on
autovacuum = on
timezone = 'Etc/UTC'
log_timezone = 'Etc/UTC'
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = top
pg_stat_statements.max = 5000
track_io_timing = on
CONF
  cat >"$conf/pg_hba.conf" <<HBA
local   all all                trust
host    all all 127.0.0.1/32   trust
HBA
}

start() {
  exists || create
  answers || pg_ctlcluster "$version" "$name" start
  wait_answers || { echo "pressure_cluster: $name did not answer on $port" >&2; exit 1; }
  psql -q -h 127.0.0.1 -p "$port" -U postgres -d template1 \
    -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "CREATE EXTENSION IF NOT EXISTS pgstattuple" >/dev/null
}

case "${1:-}" in
  start)
    answers || start
    exists || { echo "pressure_cluster: port $port answers but $name does not exist" >&2; exit 1; }
    url
    ;;
  restart)
    exists || { echo "pressure_cluster: $name does not exist" >&2; exit 1; }
    pg_ctlcluster "$version" "$name" restart -m fast
    wait_answers || { echo "pressure_cluster: $name did not answer on $port" >&2; exit 1; }
    ;;
  stop)
    if exists; then
      pg_ctlcluster "$version" "$name" stop -m fast || true
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
  url) url ;;
  *) usage ;;
esac
