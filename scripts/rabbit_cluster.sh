#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, for the tests that need one
# (tests/faults/test_rabbit_cluster.py): jcr1@localhost, jcr2@localhost and
# jcr3@localhost on AMQP ports 5681-5683 (127.0.0.1 only), distribution ports
# 25681-25683, data and logs under $JOBCORE_RABBIT_CLUSTER_DIR
# (default /tmp/jobcore-rabbit-cluster). The machine's own node (rabbit@localhost, 5672)
# is never touched: every command here names one of our nodes.
#
#   scripts/rabbit_cluster.sh start          start the nodes and cluster them (idempotent:
#                                            a healthy cluster is left as it is)
#   scripts/rabbit_cluster.sh stop           stop the three nodes (data kept until start)
#   scripts/rabbit_cluster.sh status         exit 0 if all three run as one cluster
#   scripts/rabbit_cluster.sh urls           the JOBCORE_AMQP_URL of the cluster
#   scripts/rabbit_cluster.sh start-node N   start node N again (after a test killed it)
#   scripts/rabbit_cluster.sh pid N          the OS pid of node N's Erlang VM
#   scripts/rabbit_cluster.sh ctl N ARGS...  rabbitmqctl ARGS against node N
#
# The nodes run as the calling user, from /usr/lib/rabbitmq/bin directly: Debian's
# wrappers in /usr/sbin switch to the rabbitmq user and drop the RABBITMQ_* environment
# that gives each node its name, ports and directories. The Erlang cookie is the calling
# user's (~/.erlang.cookie, created by the first node if missing), which the CLI calls
# here and in the tests share.
set -euo pipefail

BASE=${JOBCORE_RABBIT_CLUSTER_DIR:-/tmp/jobcore-rabbit-cluster}
RMQ_BIN=${JOBCORE_RABBIT_BIN:-/usr/lib/rabbitmq/bin}
NODES=(1 2 3)
# A node boots in 5-15 s on an idle 2-core machine; much more while the suite runs.
BOOT_TIMEOUT=${JOBCORE_RABBIT_BOOT_TIMEOUT:-180}
LOCK="$BASE.lock"

log() { echo "rabbit_cluster: $*" >&2; }

node_name() { echo "jcr$1@localhost"; }

# Everything that makes node $1 its own: name, ports, directories, config. Exported for
# rabbitmq-server and the CLI tools alike (the CLI reads the same env file).
node_env() {
  local i=$1 dir="$BASE/jcr$1"
  export RABBITMQ_NODENAME
  RABBITMQ_NODENAME=$(node_name "$i")
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$((5680 + i))
  export RABBITMQ_DIST_PORT=$((25680 + i))
  export RABBITMQ_MNESIA_BASE="$dir/mnesia"
  export RABBITMQ_LOG_BASE="$dir/log"
  export RABBITMQ_PID_FILE="$dir/pid"
  export RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
  # Not /etc/rabbitmq/rabbitmq-env.conf: it names the machine's node.
  export RABBITMQ_CONF_ENV_FILE="$BASE/rabbitmq-env.conf"
  # No plugins (no management UI): less CPU, memory and ports.
  export RABBITMQ_ENABLED_PLUGINS_FILE="$BASE/enabled_plugins"
  export ERL_EPMD_ADDRESS=127.0.0.1
  # One scheduler (2 cores shared by the whole suite), few async threads, no busy
  # waiting, distribution on loopback only.
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S 1:1 +SDio 1 +A 4 +sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}"
}

ctl() { # ctl N ARGS...: rabbitmqctl against node N
  local i=$1
  shift
  (node_env "$i" && timeout 60 "$RMQ_BIN/rabbitmqctl" -q -n "$(node_name "$i")" "$@")
}

diag() {
  local i=$1
  shift
  (node_env "$i" && timeout 60 "$RMQ_BIN/rabbitmq-diagnostics" -q -n "$(node_name "$i")" "$@")
}

write_config() {
  mkdir -p "$BASE"
  : >"$BASE/rabbitmq-env.conf"
  echo "[]." >"$BASE/enabled_plugins"
  local i
  for i in "${NODES[@]}"; do
    mkdir -p "$BASE/jcr$i/mnesia" "$BASE/jcr$i/log"
    cat >"$BASE/jcr$i/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$((5680 + i))
log.file.level = info
log.console = false
# Queue and connection statistics every minute, not every 5 s (nothing reads them).
collect_statistics = none
collect_statistics_interval = 60000
# Several nodes share this machine's memory and disk with the suite.
vm_memory_high_watermark.relative = 0.2
disk_free_limit.absolute = 50MB
EOF
  done
}

pid_of() { # the OS pid of node N's VM, if it runs
  local file="$BASE/jcr$1/pid"
  [[ -s $file ]] || return 1
  local pid
  pid=$(tr -dc '0-9' <"$file")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

port_open() { # port_open N: node N's AMQP listener accepts (it opens last, once booted)
  (exec 3<>"/dev/tcp/127.0.0.1/$((5680 + $1))") 2>/dev/null
}

wait_running() { # wait_running N: until node N serves AMQP (bounded)
  # Polls the port, not the CLI: each CLI call boots an Erlang VM (about 0.6 s of CPU).
  local i=$1 end=$((SECONDS + BOOT_TIMEOUT)) seen=0
  until port_open "$i"; do
    if pid_of "$i" >/dev/null; then
      seen=1
    elif ((seen)); then
      log "node $(node_name "$i") exited while booting; see $BASE/jcr$i/log"
      tail -20 "$BASE/jcr$i/log/server.out" >&2 || true
      return 1
    fi
    if ((SECONDS >= end)); then
      log "node $(node_name "$i") did not start within ${BOOT_TIMEOUT}s; see $BASE/jcr$i/log"
      return 1
    fi
    sleep 0.5
  done
}

start_node() { # start_node N: boot node N in the background and wait for it
  local i=$1
  if pid_of "$i" >/dev/null; then
    wait_running "$i"
    return
  fi
  rm -f "$BASE/jcr$i/pid"
  (
    node_env "$i"
    # Its own session: the node outlives the shell (and CI step) that started it.
    setsid "$RMQ_BIN/rabbitmq-server" >"$BASE/jcr$i/log/server.out" 2>&1 </dev/null 9>&- &
  )
  wait_running "$i"
}

cluster_size() { # running members as node 1 sees them
  ctl 1 cluster_status --formatter json 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("running_nodes", [])))' \
      2>/dev/null || echo 0
}

healthy() {
  local i
  for i in "${NODES[@]}"; do
    pid_of "$i" >/dev/null || return 1
    port_open "$i" || return 1
  done
  [[ $(cluster_size) == "${#NODES[@]}" ]]
}

stop_node() {
  local i=$1 pid
  pid=$(pid_of "$i") || return 0
  ctl "$i" stop >/dev/null 2>&1 || true
  local end=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= end)); then
      kill -9 "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.5
  done
}

cmd_start() {
  if healthy; then
    log "cluster already running"
    return 0
  fi
  local started=$SECONDS i
  # Not healthy: build it again from nothing (a half-formed cluster from an earlier run
  # costs more to diagnose than a fresh one costs to boot).
  for i in "${NODES[@]}"; do stop_node "$i"; done
  rm -rf "${BASE:?}"/jcr*
  write_config
  local pids=()
  for i in "${NODES[@]}"; do
    start_node "$i" &
    pids+=($!)
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  ((failed == 0)) || return 1
  log "3 nodes booted in $((SECONDS - started))s; clustering them"
  # Joins one at a time (each changes the cluster's schema); the app restarts around
  # them, the slow part, in parallel.
  local joiners=("${NODES[@]:1}") out="$BASE/join.out"
  for i in "${joiners[@]}"; do ctl "$i" stop_app >>"$out" 2>&1 & done
  wait
  for i in "${joiners[@]}"; do
    # It prints errors about tables it creates later ("node_not_running"): noise, kept
    # in join.out; a failed join still fails the script.
    ctl "$i" join_cluster "$(node_name 1)" >>"$out" 2>&1 || { cat "$out" >&2; return 1; }
  done
  pids=()
  for i in "${joiners[@]}"; do
    { ctl "$i" start_app >>"$out" 2>&1 && wait_running "$i"; } &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  ((failed == 0)) || { cat "$out" >&2; return 1; }
  if [[ $(cluster_size) != "${#NODES[@]}" ]]; then
    log "the nodes did not form one cluster:"
    ctl 1 cluster_status >&2 || true
    return 1
  fi
  log "cluster of ${#NODES[@]} nodes running in $((SECONDS - started))s ($(cmd_urls))"
}

cmd_stop() {
  local i
  for i in "${NODES[@]}"; do stop_node "$i" & done
  wait
}

cmd_urls() {
  local i urls=()
  for i in "${NODES[@]}"; do urls+=("amqp://guest:guest@127.0.0.1:$((5680 + i))/"); done
  (IFS=,; echo "${urls[*]}")
}

locked() { # run "$@" holding the cluster's lock (CI's start and the tests' may overlap)
  mkdir -p "$(dirname "$LOCK")"
  exec 9>"$LOCK"
  flock -w $((BOOT_TIMEOUT * 2)) 9 || { log "timed out waiting for $LOCK"; return 1; }
  "$@"
}

case "${1:-}" in
  start) locked cmd_start ;;
  stop) locked cmd_stop ;;
  status) healthy ;;
  urls) cmd_urls ;;
  start-node) start_node "${2:?node number}" ;;
  pid) pid_of "${2:?node number}" ;;
  ctl) shift && ctl "$@" ;;
  *)
    echo "usage: $0 start|stop|status|urls|start-node N|pid N|ctl N ARGS..." >&2
    exit 2
    ;;
esac
