#!/usr/bin/env bash
# Install what tests/test_deploy.py needs to check the alert rules in deploy/prometheus:
# promtool, from Debian's prometheus package (the server it also ships is not started).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    source scripts/_apt.sh
    apt_install "promtool, which checks the shipped alert rules (the server is not started)" \
      --no-install-recommends prometheus
  else
    echo "setup_promtool: promtool is missing and we are not root;" \
      "install Debian's prometheus package, or the promtool tests will be skipped." >&2
  fi
fi
echo "setup_promtool: promtool $(command -v promtool >/dev/null && echo present || echo missing)"
