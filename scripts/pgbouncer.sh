#!/usr/bin/env bash
# The test suite's own PgBouncer (Debian's 1.18) in transaction mode, in front of the
# machine's PostgreSQL: scripts/pgbouncer.sh start|stop|status.
#
#   PGBOUNCER_PORT      where it listens on 127.0.0.1 (default 6441)
#   PGBOUNCER_DIR       its config, pidfile, log and socket (default /tmp/jobcore-pgbouncer-PORT)
#   PGBOUNCER_POOL_SIZE server connections per database and user (default 2: few enough
#                       that two clients' transactions share one, so a prepared statement
#                       or a SET leaking across transactions shows up as an error)
#   PGBOUNCER_UPSTREAM  host=... port=... of PostgreSQL (default host=127.0.0.1 port=5432)
#
# Any database name is served (the tests create scratch databases), users are trusted
# (the upstream server authenticates them: trust here). `start` does nothing when it
# already runs and answers; concurrent starts (pytest-xdist workers) take turns on a lock.
set -euo pipefail

port=${PGBOUNCER_PORT:-6441}
dir=${PGBOUNCER_DIR:-/tmp/jobcore-pgbouncer-$port}
pool_size=${PGBOUNCER_POOL_SIZE:-2}
upstream=${PGBOUNCER_UPSTREAM:-host=127.0.0.1 port=5432}
binary=${PGBOUNCER_BINARY:-/usr/sbin/pgbouncer}
pidfile=$dir/pgbouncer.pid

usage() { echo "usage: $0 start|stop|status" >&2; exit 2; }

answers() { pg_isready -q -h 127.0.0.1 -p "$port" -t 2 -d pgbouncer -U postgres; }

running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

write_config() {
  # pgbouncer refuses to run as root: it runs as postgres then, which must own the dir.
  mkdir -p "$dir"
  echo '"postgres" ""' >"$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = $upstream

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir = $dir
pidfile = $pidfile
logfile = $dir/pgbouncer.log
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
stats_users = postgres
pool_mode = transaction
default_pool_size = $pool_size
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
max_db_connections = 0
; Scratch databases come and go: forget an idle one's pool soon.
autodb_idle_timeout = 60
server_idle_timeout = 60
; What jobcore's SET idle_in_transaction_session_timeout does without PgBouncer.
idle_transaction_timeout = 60
query_wait_timeout = 60
; psycopg sends none of these, but drivers of other tools may.
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
EOF
  if [ "$(id -u)" -eq 0 ]; then chown -R postgres "$dir"; fi
}

start() {
  if ! [ -x "$binary" ]; then
    echo "pgbouncer: $binary is missing (scripts/install_tools.sh installs it)" >&2
    exit 1
  fi
  mkdir -p "$dir"
  exec 9>"$dir.lock"
  flock -w 30 9
  if running && answers; then
    return 0
  fi
  if running; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  write_config
  local as_user=()
  if [ "$(id -u)" -eq 0 ]; then as_user=(-u postgres); fi
  # Not inheriting the lock: the daemon would hold it for its life.
  "$binary" -d "${as_user[@]}" "$dir/pgbouncer.ini" 9>&-
  for _ in $(seq 1 100); do
    if answers; then
      echo "pgbouncer: listening on 127.0.0.1:$port (transaction mode, $pool_size server connections per database)"
      return 0
    fi
    sleep 0.1
  done
  echo "pgbouncer: did not answer on 127.0.0.1:$port within 10 s; see $dir/pgbouncer.log:" >&2
  tail -n 5 "$dir/pgbouncer.log" >&2 || true
  exit 1
}

stop() {
  if running; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || { echo "pgbouncer: stopped"; return 0; }
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  echo "pgbouncer: stopped"
}

status() {
  if running && answers; then
    echo "pgbouncer: running on 127.0.0.1:$port (pid $(cat "$pidfile"), $dir)"
  else
    echo "pgbouncer: not running on 127.0.0.1:$port"
    return 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
