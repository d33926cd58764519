#!/usr/bin/env bash
# The console's browser test (tests/e2e/test_console_browser.py) drives Debian's chromium
# through Playwright: install it from apt if it is missing. Never `playwright install`
# (a browser download from the internet).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_browser: /usr/bin/chromium is missing; run: sudo apt-get install -y chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends chromium >/dev/null || {
  apt-get update >/dev/null
  apt-get install -y --no-install-recommends chromium >/dev/null
}
/usr/bin/chromium --version
