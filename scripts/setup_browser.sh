#!/usr/bin/env bash
# Install what the admin browser tests need: Debian's Chromium (Playwright cannot
# download its own browsers here) and pytest-playwright in .venv. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv postgres,mysql,test,example  # the test command's .venv

if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    source scripts/_apt.sh
    apt_install "the browser the admin's browser tests drive (Playwright cannot download its own here)" \
      chromium
  else
    echo "setup_browser: /usr/bin/chromium is missing and we are not root;" \
      "install Debian's chromium package, or the browser tests will be skipped." >&2
  fi
fi

if ! .venv/bin/python -c "import pytest_playwright" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check pytest-playwright
fi
echo "setup_browser: chromium $([ -x /usr/bin/chromium ] && echo present || echo missing)," \
  "pytest-playwright $(.venv/bin/python -c 'import pytest_playwright' 2>/dev/null \
  && echo present || echo missing)"
