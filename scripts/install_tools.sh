#!/usr/bin/env bash
# The Debian packages the test suite and the bench drive, installed when missing:
#   chromium   the console's browser test, through Playwright (never `playwright install`);
#   pgbouncer  the part of the suite that runs behind PgBouncer in transaction mode;
#   wrk        the bench's HTTP load generator (C, so it is not what the enqueue bench measures).
# A second PostgreSQL cluster and extra RabbitMQ nodes come from the packages already here
# (pg_createcluster, rabbitmq-server); the test support starts them.
set -euo pipefail
declare -A binary=([chromium]=/usr/bin/chromium [pgbouncer]=/usr/sbin/pgbouncer [wrk]=/usr/bin/wrk)
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
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null || {
  apt-get update >/dev/null
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
}
# Debian starts pgbouncer as a system service on 6432 when it installs it; the suite runs
# its own instances (scripts/pgbouncer.sh), so only the packaged service is stopped.
if [[ " ${missing[*]} " == *" pgbouncer "* ]]; then
  service pgbouncer stop >/dev/null 2>&1 || true
fi
for package in "${missing[@]}"; do
  [ -x "${binary[$package]}" ] || { echo "install_tools: $package did not install" >&2; exit 1; }
done
