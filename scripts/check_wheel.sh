#!/usr/bin/env bash
# The wheel stands on its own: build it, install it (with the bench extra, pinned by
# requirements.lock) into a new virtual environment in a temporary directory, and from
# there, outside the checkout, run `jobcore demo`, `jobcore chaos` and a quick
# `jobcore bench`. Nothing can come from the source tree: not `tests/`, not `bench/`, not
# the migrations.
#
# It uses the machine's PostgreSQL and RabbitMQ without disrupting them: the demo gets a
# database and a broker prefix of its own (removed at the end); chaos makes its own and
# throws only the faults aimed at its own processes and proxies (kills and silent cuts,
# not the broker or database restarts, which stop the shared services).
#
#   scripts/check_wheel.sh            # CHAOS_SECONDS=30 by default
#   CHAOS_SECONDS=10 scripts/check_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
CHAOS_SECONDS=${CHAOS_SECONDS:-30}
PYTHON=${PYTHON:-python3}

work=$(mktemp -d "${TMPDIR:-/tmp}/jobcore-wheel.XXXXXX")
run_id=$(basename "$work" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
db_url="postgresql://postgres@127.0.0.1:5432/jobcore_wheel_${run_id}"
prefix="jobcore-wheel-${run_id}"

step() { echo "check_wheel: $* ($(date -u +%H:%M:%S))"; }

cleanup() {
  local code=$?
  if [[ -x "$work/venv/bin/python" ]]; then
    # The demo's database and queues (chaos and bench remove their own).
    (cd "$work" && JOBCORE_DATABASE_URL=$db_url JOBCORE_AMQP_PREFIX=$prefix \
      JOBCORE_JOB_MODULES=jobcore.examples.jobtypes,jobcore.examples.demo timeout 60 \
      "$work/venv/bin/python" -c '
import asyncio, contextlib
from jobcore.testing.scratch import delete_topology, drop_database
from jobcore.kernel.settings import load_settings
config = load_settings()
with contextlib.suppress(Exception):
    asyncio.run(delete_topology(config))
drop_database(config)
') || echo "check_wheel: could not remove the demo's database or queues" >&2
  fi
  if ((code == 0)); then
    rm -rf "$work"
  else
    echo "check_wheel: failed; logs kept in $work" >&2
  fi
}
trap cleanup EXIT

step "building the wheel"
"$repo/.venv/bin/python" -m build --wheel --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/dist/jobcore-*.whl)
# Listed once into a file: `unzip -l | grep -q` under pipefail fails whenever grep finds its
# line and exits before unzip has written the rest (unzip dies of SIGPIPE).
unzip -l "$wheel" >"$work/wheel.list"
if grep -qE ' (tests|bench)/' "$work/wheel.list"; then
  echo "check_wheel: the wheel carries tests/ or bench/" >&2
  exit 1
fi

for shipped in services/ui/templates/base.html services/ui/static/ui.css services/ui/static/ui.js; do
  if ! grep -q " $shipped\$" "$work/wheel.list"; then
    echo "check_wheel: the wheel lacks the console's $shipped" >&2
    exit 1
  fi
done

step "installing $(basename "$wheel") into a new virtual environment"
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check \
  -c "$repo/requirements.lock" "${wheel}[bench]"

cd "$work"  # outside the checkout: only the installed wheel can be imported
export PATH="$work/venv/bin:$PATH"
unset PYTHONPATH
if python -c 'import tests' 2>/dev/null; then
  echo "check_wheel: a 'tests' package is importable from the new environment" >&2
  exit 1
fi

step "jobcore demo"
JOBCORE_DATABASE_URL=$db_url JOBCORE_AMQP_PREFIX=$prefix \
  jobcore demo --log "$work/demo/stack.log"

step "jobcore chaos --duration ${CHAOS_SECONDS}"
jobcore chaos --duration "$CHAOS_SECONDS" --log-dir "$work/chaos" \
  --fault kill_relay --fault kill_worker --fault broker_cut --fault database_cut \
  --fault worker_commit_cut --fault relay_commit_cut

step "jobcore bench e2e (quick)"
jobcore bench e2e --jobs 200 --runs 1 --out "$work/bench"
python - "$work/bench/report.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
figures = [f for s in report["scenarios"] for f in s["figures"]]
assert figures and all(f["runs"] for f in figures), "the bench measured nothing"
print(f"check_wheel: bench wrote {len(figures)} figures")
EOF
step "the wheel works"
