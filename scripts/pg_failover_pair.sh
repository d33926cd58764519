#!/usr/bin/env bash
# A scratch PostgreSQL pair for the failover test (tests/faults/test_pg_failover.py): two
# clusters of this machine's PostgreSQL, jcfail_a on 5441 and jcfail_b on 5442, one the
# primary and the other its streaming replica (pg_basebackup -R), with synchronous
# replication while both run. Which one is the primary changes with every failover; the
# services find it with the multi-host URL
#   postgresql://postgres@127.0.0.1:5441,127.0.0.1:5442/jobcore?target_session_attrs=read-write
# Trust auth on 127.0.0.1 only, small shared_buffers, never started at boot. The machine's
# own cluster (main, 5432) is never touched.
#
#   create          make the clusters that are missing, then `start`
#   start           start both and repair the pair: the node that is not the primary (stopped,
#                   diverged after a failover, or a second primary) becomes a fresh replica of
#                   the primary (pg_basebackup), and the primary waits for it on commit
#   stop            stop both
#   destroy         stop and drop both
#   status          one line per node: name port state role
#   primary         the port of the primary (exit 1 if none runs)
#   crash NAME      stop NAME as a crash would (-m immediate)
#   promote NAME    make replica NAME the primary; it runs without a synchronous standby
#                   until `start` gives it a replica again (otherwise every commit would wait)
#
# Idempotent: each command brings the pair to its state from whatever state it finds. Runs
# as root (clusters run as the postgres user) or as postgres.
set -euo pipefail

VERSION="${JOBCORE_PG_PAIR_VERSION:-$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)}"
NAMES=(jcfail_a jcfail_b)
declare -A PORTS=([jcfail_a]=5441 [jcfail_b]=5442)
HOST=127.0.0.1
WAIT_SECONDS=60

die() { echo "pg_failover_pair: $*" >&2; exit 1; }

[[ -n "$VERSION" && -d "/usr/lib/postgresql/$VERSION/bin" ]] \
  || die "no PostgreSQL server found under /usr/lib/postgresql (install postgresql)"
case "$(id -un)" in
  root | postgres) ;;
  *) die "run as root or as postgres (the clusters belong to the postgres user)" ;;
esac

as_postgres() {
  if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

exists() { [[ -f "/etc/postgresql/$VERSION/$1/postgresql.conf" ]]; }
datadir() { echo "/var/lib/postgresql/$VERSION/$1"; }
confdir() { echo "/etc/postgresql/$VERSION/$1"; }
running() { pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$1" status >/dev/null 2>&1; }
sql() {
  psql -X -q -A -t -h "$HOST" -p "${PORTS[$1]}" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "$2" 2>/dev/null
}
# primary | replica | down
role() {
  local answer
  answer="$(sql "$1" "SELECT pg_is_in_recovery()")" || { echo down; return; }
  [[ "$answer" == f ]] && echo primary || echo replica
}
other() { [[ "$1" == "${NAMES[0]}" ]] && echo "${NAMES[1]}" || echo "${NAMES[0]}"; }

wait_for() { # wait_for WHAT COMMAND...: poll once a 0.2 s until COMMAND succeeds
  local what="$1" end=$((SECONDS + WAIT_SECONDS))
  shift
  until "$@"; do
    ((SECONDS < end)) || die "timed out waiting for $what"
    sleep 0.2
  done
}
accepts() { pg_isready -q -h "$HOST" -p "${PORTS[$1]}"; }
is_primary() { [[ "$(role "$1")" == primary ]]; }
streams_to() { # streams_to PRIMARY: a replica streams from it and counts as synchronous
  [[ "$(sql "$1" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" -ge 1 ]]
}

ctl() { pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$@"; }

# The primary waits for its replica on commit (synchronous_commit = on: the replica has
# flushed the commit's WAL) only while it has one: "*" with no replica would hang every
# commit. tests/faults/test_pg_failover.py and docs/operations.md say why.
set_sync() { # set_sync NAME '*'|''
  local file wanted
  file="$(confdir "$1")/conf.d/60-jobcore-sync.conf"
  wanted="$(printf "synchronous_standby_names = '%s'\nsynchronous_commit = on" "$2")"
  [[ -f "$file" && "$(cat "$file")" == "$wanted" ]] && return
  echo "$wanted" >"$file"
  chown postgres:postgres "$file"
  if running "$1"; then ctl "$1" reload >/dev/null; fi
}

make_cluster() { # make_cluster NAME: an empty, stopped cluster with the pair's settings
  local name="$1" conf
  # UTF-8 whatever the caller's locale (without one the cluster would be SQL_ASCII).
  pg_createcluster "$VERSION" "$name" -p "${PORTS[$name]}" --start-conf manual \
    --locale=C.UTF-8 --encoding=UTF8 >/dev/null
  conf="$(confdir "$name")"
  mkdir -p "$conf/conf.d"
  cat >"$conf/conf.d/50-jobcore-pair.conf" <<EOF
# scripts/pg_failover_pair.sh: a small scratch cluster for the failover test.
listen_addresses = '$HOST'
shared_buffers = 16MB
max_connections = 100
wal_level = replica
max_wal_senders = 4
max_replication_slots = 4
wal_keep_size = 128MB
hot_standby = on
EOF
  cat >"$conf/pg_hba.conf" <<EOF
# scripts/pg_failover_pair.sh: trust, and only on this machine.
local   all          all                 trust
local   replication  all                 trust
host    all          all   $HOST/32  trust
host    replication  all   $HOST/32  trust
EOF
  chown -R postgres:postgres "$conf"
  set_sync "$name" ""
}

# Make NAME a fresh replica of PRIMARY: whatever NAME held is discarded (after a failover
# the old primary may hold commits the new one never got; it cannot just follow it).
rebuild_replica() { # rebuild_replica NAME PRIMARY
  local name="$1" primary="$2" data
  data="$(datadir "$name")"
  ctl "$name" stop -m fast >/dev/null 2>&1 || true
  set_sync "$name" ""
  # Until the replica streams, the primary's commits must not wait for it.
  set_sync "$primary" ""
  rm -rf "$data"
  install -d -o postgres -g postgres -m 700 "$data"
  as_postgres pg_basebackup -h "$HOST" -p "${PORTS[$primary]}" -U postgres -D "$data" \
    -R -X stream -c fast
  ctl "$name" start
  wait_for "$name to accept connections" accepts "$name"
  wait_for "$name to stream from $primary" streams_to "$primary"
  set_sync "$primary" "*"
}

timeline() { # the timeline of a primary's current WAL (a promoted node has a higher one)
  local wal
  wal="$(sql "$1" "SELECT pg_walfile_name(pg_current_wal_lsn())")"
  echo $((16#${wal:0:8}))
}

running_primary() { # the first running node that is a primary, if any
  local name
  for name in "${NAMES[@]}"; do
    if running "$name" && is_primary "$name"; then echo "$name"; return; fi
  done
}

cmd_start() {
  local name a="${NAMES[0]}" b="${NAMES[1]}" primary replica
  for name in "${NAMES[@]}"; do
    exists "$name" || die "cluster $name is missing (run: $0 create)"
  done
  primary="$(running_primary)"
  if [[ -z "$primary" ]]; then
    # Nothing serves writes: start both and see. With a primary running, the other node is
    # never started as it is: an old primary would come up writable beside the new one.
    for name in "${NAMES[@]}"; do
      if ! running "$name"; then ctl "$name" start >/dev/null 2>&1 || true; fi
      if running "$name"; then wait_for "$name to accept connections" accepts "$name"; fi
    done
    if is_primary "$a" && is_primary "$b"; then
      # The old primary of a failover, started again: the promoted node (the higher
      # timeline) wins.
      if (($(timeline "$b") > $(timeline "$a"))); then primary="$b"; else primary="$a"; fi
    else
      primary="$(running_primary)"
    fi
    [[ -n "$primary" ]] \
      || die "no primary: $(cmd_status | tr '\n' ';') (promote one: $0 promote NAME)"
  fi
  replica="$(other "$primary")"
  if running "$replica" && [[ "$(role "$replica")" == replica ]] && streams_to "$primary"; then
    set_sync "$replica" ""
    set_sync "$primary" "*"
  else
    rebuild_replica "$replica" "$primary"
  fi
}

cmd_create() {
  local a="${NAMES[0]}" b="${NAMES[1]}"
  if ! exists "$a" && ! exists "$b"; then
    make_cluster "$a"
    ctl "$a" start
    wait_for "$a to accept connections" accepts "$a"
    make_cluster "$b"
    rebuild_replica "$b" "$a"
    return
  fi
  # One of them is missing: make it, empty; `start` turns it into the replica.
  for name in "$a" "$b"; do
    exists "$name" || make_cluster "$name"
  done
  cmd_start
}

cmd_stop() {
  local name
  for name in "${NAMES[@]}"; do
    if exists "$name" && running "$name"; then ctl "$name" stop -m fast; fi
  done
}

cmd_destroy() {
  local name
  for name in "${NAMES[@]}"; do
    if exists "$name"; then pg_dropcluster "$VERSION" "$name" --stop; fi
  done
}

cmd_status() {
  local name
  for name in "${NAMES[@]}"; do
    if ! exists "$name"; then
      echo "$name ${PORTS[$name]} missing"
    elif running "$name"; then
      echo "$name ${PORTS[$name]} running $(role "$name")"
    else
      echo "$name ${PORTS[$name]} stopped"
    fi
  done
}

cmd_primary() {
  local name
  for name in "${NAMES[@]}"; do
    if exists "$name" && is_primary "$name"; then
      echo "${PORTS[$name]}"
      return
    fi
  done
  die "no primary is running"
}

node() { # node NAME: NAME if it is one of the pair's
  [[ -n "${1:-}" && -n "${PORTS[$1]+x}" ]] || die "unknown node '${1:-}' (one of: ${NAMES[*]})"
  echo "$1"
}

case "${1:-}" in
  create) cmd_create ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  destroy) cmd_destroy ;;
  status) cmd_status ;;
  primary) cmd_primary ;;
  crash)
    name="$(node "${2:-}")"
    ctl "$name" stop -m immediate
    ;;
  promote)
    name="$(node "${2:-}")"
    set_sync "$name" ""
    ctl "$name" promote
    wait_for "$name to be the primary" is_primary "$name"
    ;;
  *) die "usage: $0 create|start|stop|destroy|status|primary|crash NAME|promote NAME" ;;
esac
