#!/usr/bin/env bash
# The test suite's S3-compatible server: moto's standalone server (`moto_server`, from
# the dev extra of pyproject.toml, pinned in requirements.lock, so `make setup` installs
# it into .venv) on 127.0.0.1: scripts/s3.sh start|stop|status.
#
#   S3_PORT    where it listens on 127.0.0.1 (default 9571)
#   S3_DIR     its pidfile and log (default /tmp/jobcore-s3-PORT)
#   S3_BINARY  the server (default .venv/bin/moto_server of this checkout)
#
# Objects live in the server's memory: a stop loses them (the tests put a TcpProxy in
# front of it to cut it off instead). Each test makes a bucket of its own, so one server
# serves every test and every pytest-xdist worker. `start` does nothing when it already
# runs and answers; concurrent starts take turns on a lock. Why moto: docs/operations.md,
# "Object storage".
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
port=${S3_PORT:-9571}
dir=${S3_DIR:-/tmp/jobcore-s3-$port}
binary=${S3_BINARY:-$root/.venv/bin/moto_server}
pidfile=$dir/s3.pid

usage() { echo "usage: $0 start|stop|status" >&2; exit 2; }

# Any HTTP answer will do (moto answers / with its bucket list).
answers() { curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; }

running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start() {
  if ! [ -x "$binary" ]; then
    echo "s3: $binary is missing (make setup installs moto[server] into .venv)" >&2
    exit 1
  fi
  mkdir -p "$dir"
  exec 9>"$dir.lock"
  flock -w 30 9
  if running && answers; then
    return 0
  fi
  if running; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  # Not inheriting the lock: the server would hold it for its life. setsid: a test
  # runner's process group ending does not take the shared server with it.
  setsid "$binary" -H 127.0.0.1 -p "$port" >"$dir/s3.log" 2>&1 9>&- </dev/null &
  echo $! >"$pidfile"
  for _ in $(seq 1 300); do
    if answers; then
      echo "s3: moto listening on 127.0.0.1:$port (pid $(cat "$pidfile"))"
      return 0
    fi
    running || break
    sleep 0.1
  done
  echo "s3: did not answer on 127.0.0.1:$port within 30 s; see $dir/s3.log:" >&2
  tail -n 5 "$dir/s3.log" >&2 || true
  exit 1
}

stop() {
  if running; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || { echo "s3: stopped"; return 0; }
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  echo "s3: stopped"
}

status() {
  if running && answers; then
    echo "s3: running on 127.0.0.1:$port (pid $(cat "$pidfile"), $dir)"
  else
    echo "s3: not running on 127.0.0.1:$port"
    return 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
