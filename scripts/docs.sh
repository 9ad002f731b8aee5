#!/usr/bin/env bash
# Build the docs site (docs/ -> docs/_build/html) with warnings as errors.
# Installs Sphinx, furo and myst-parser (the `docs` extra) into .venv when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
# The docs' configuration imports the app with the test settings: any .venv of
# ./scripts/test will do.
[ -x .venv/bin/python ] || ensure_venv test
if ! .venv/bin/python -c "import sphinx, furo, myst_parser" 2>/dev/null; then
  if grep -qE '^docs *=' pyproject.toml; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[docs]"
  else
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
      "sphinx>=7.2" "furo>=2024.1" "myst-parser>=3"
  fi
fi
rm -rf docs/_build   # a full build, so every warning shows on every run
OUTBOX_TEST_DB=sqlite .venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html
echo "docs: docs/_build/html/index.html"
