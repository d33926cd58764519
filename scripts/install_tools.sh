#!/usr/bin/env bash
# The Debian packages the test suite and the bench drive, installed when missing:
#   chromium   the console's browser test, through Playwright (never `playwright install`);
#   pgbouncer  the part of the suite that runs behind PgBouncer in transaction mode;
#   wrk        the bench's HTTP load generator (C, so it is not what the enqueue bench measures);
#   prometheus promtool (`make lint` checks and unit-tests deploy/prometheus/alerts.yaml) and
#              the server tests/e2e/test_alerts_prometheus.py runs on its own port.
# A second PostgreSQL cluster and extra RabbitMQ nodes come from the packages already here
# (pg_createcluster, rabbitmq-server); the test support starts them.
set -euo pipefail
declare -A binary=([chromium]=/usr/bin/chromium [pgbouncer]=/usr/sbin/pgbouncer [wrk]=/usr/bin/wrk
  [prometheus]=/usr/bin/promtool)
missing=()
for package in "${!binary[@]}"; do
  [ -x "${binary[$package]}" ] || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_tools: missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Update first when a package is missing: a fresh image's lists are stale or empty.
apt-get update >/dev/null
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts pgbouncer as a system service on 6432 when it installs it; the suite runs
# its own instances (scripts/pgbouncer.sh), so only the packaged service is stopped.
if [[ " ${missing[*]} " == *" pgbouncer "* ]]; then
  service pgbouncer stop >/dev/null 2>&1 || true
fi
# The same for prometheus (9090) and the node exporter it recommends: the test starts its own.
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
  service prometheus stop >/dev/null 2>&1 || true
fi
for package in "${missing[@]}"; do
  [ -x "${binary[$package]}" ] || { echo "install_tools: $package did not install" >&2; exit 1; }
done
