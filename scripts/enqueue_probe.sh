#!/usr/bin/env bash
# The enqueue comparison by hand, outside `jobcore bench`: one `jobcore api` process and the
# bench's minimal FastAPI+psycopg app (services/bench/minimal_app.py) on one scratch
# database, each loaded by wrk with the bench's own Lua (a fresh Idempotency-Key per
# request), alternately (ABAB): for when the bench's enqueue ratio and a hand-run wrk
# disagree.
#
#   scripts/enqueue_probe.sh [quotas on|off] [connections] [seconds] [runs] [analyze yes|no]
#
#   PROBE_MINIMAL_TABLES  own (default: trigger-free copies of jobs and outbox) or jobcore
#                 (jobcore's tables, whose quota trigger locks the tenant's usage row)
#   PROBE_SERVER  the PostgreSQL server (default: the bench's stats cluster on 5451,
#                 scripts/pg_stats_cluster.sh start; its pg_stat_statements then also
#                 gives each side's statements, printed per request)
#
# Quotas "on" are the bench stacks' (jobcore.testing.pipeline.LOAD_QUOTAS: checked on
# every request, set far above the rate); "off" sets them to 0 (unlimited, not checked).
# Prints one line per run: side, requests/s, p50/p99 ms, and the load average.
set -euo pipefail

quotas=${1:-off}
connections=${2:-64}
seconds=${3:-10}
runs=${4:-2}
analyze=${5:-yes}
server=${PROBE_SERVER:-postgresql://postgres@127.0.0.1:5451}
root=$(cd "$(dirname "$0")/.." && pwd)
py=$root/.venv/bin/python
jobcore=$root/.venv/bin/jobcore
db=jobcore_probe_$$
tmp=$(mktemp -d /tmp/jobcore-probe-XXXXXX)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  psql -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

export JOBCORE_DATABASE_URL=$server/$db
psql -q "$server/postgres" -c "CREATE DATABASE $db" >/dev/null
"$jobcore" migrate >/dev/null
psql -q "$JOBCORE_DATABASE_URL" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
  >/dev/null 2>&1 || true
key=$("$jobcore" keys create --tenant probe --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["key"])')
"$py" -c 'from services.bench.wrk import SCRIPT; print(SCRIPT)' >"$tmp/post.lua"
cat >"$tmp/summary.py" <<'EOF'
import json, os, sys

line = next(x for x in sys.stdin if x.startswith("JOBCORE-WRK-RESULT "))
r = json.loads(line.split(" ", 1)[1])
rate = r["requests"] / (r["duration_us"] / 1e6)
p50, p99 = r["p50_us"] / 1000, r["p99_us"] / 1000
errors = f"{r['status_errors']}+{r['socket_errors']}"
print(f"{sys.argv[1]:9} {rate:7.1f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
      f"errors {errors}  load {os.getloadavg()[0]:.2f}")
EOF

if [ "$quotas" = on ]; then
  quota_env=(JOBCORE_QUOTA_ENQUEUE_RATE=1000000 JOBCORE_QUOTA_ENQUEUE_BURST=1000000
    JOBCORE_QUOTA_MAX_UNFINISHED=1000000000)
else
  quota_env=(JOBCORE_QUOTA_ENQUEUE_RATE=0 JOBCORE_QUOTA_MAX_UNFINISHED=0)
fi
api_port=$("$py" -c 'from jobcore.testing.pipeline import free_port; print(free_port())')
env "${quota_env[@]}" "$jobcore" api --port "$api_port" >"$tmp/api.log" 2>&1 &
pids+=($!)
base_port=$("$py" -c 'from jobcore.testing.pipeline import free_port; print(free_port())')
(cd "$root" && JOBCORE_BENCH_MINIMAL_TABLES=${PROBE_MINIMAL_TABLES:-own} exec "$py" -m uvicorn --factory services.bench.minimal_app:app_from_environment \
  --host 127.0.0.1 --port "$base_port" --loop uvloop --http httptools --no-access-log \
  --log-level warning) >"$tmp/minimal.log" 2>&1 &
pids+=($!)
for port in "$api_port" "$base_port"; do
  for _ in $(seq 1 600); do # bounded: 60 s
    curl -fs -o /dev/null -X POST -H 'Content-Type: application/json' \
      -H "Authorization: Bearer $key" -d '{}' "http://127.0.0.1:$port/jobs/noop" && break
    sleep 0.1
  done
done

load() {
  local side=$1 port=$2 auth=$3
  JOBCORE_BENCH_AUTH=$auth wrk -t1 "-c$connections" "-d${seconds}s" --timeout 10s \
    -s "$tmp/post.lua" "http://127.0.0.1:$port/jobs/noop" -- /jobs/noop '{}' "$side-$RANDOM$RANDOM" |
    "$py" "$tmp/summary.py" "$side"
}

stats() {
  psql -qAt "$JOBCORE_DATABASE_URL" -c "SELECT pg_stat_statements_reset()" >/dev/null 2>&1 || true
}

statements() {
  psql -qAt -F ' | ' "$JOBCORE_DATABASE_URL" -c "
    SELECT calls, round(total_exec_time::numeric, 1) AS ms,
           left(regexp_replace(query, '\s+', ' ', 'g'), 90)
    FROM pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel
    ORDER BY total_exec_time DESC LIMIT 8" 2>/dev/null | sed 's/^/    /' || true
}

# Warm-up (and, as autovacuum would do within a minute, statistics on the filled tables).
load warmup-jc "$api_port" "Bearer $key" >/dev/null
load warmup-min "$base_port" "" >/dev/null
if [ "$analyze" = yes ]; then
  psql -q "$JOBCORE_DATABASE_URL" -c ANALYZE >/dev/null
fi
echo "quotas $quotas, $connections connections, ${seconds}s, analyze $analyze," \
  "minimal app on ${PROBE_MINIMAL_TABLES:-own} tables"
for run in $(seq 1 "$runs"); do
  stats
  load jobcore "$api_port" "Bearer $key"
  [ "$run" = 1 ] && statements
  stats
  load minimal "$base_port" ""
  [ "$run" = 1 ] && statements
done
