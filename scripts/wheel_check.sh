#!/usr/bin/env bash
# Release check: build the sdist and the wheel, `twine check --strict` them, check what the
# wheel ships, then install ONLY the wheel (with the [postgres] and [example] extras) into a
# fresh virtualenv and run against it:
# - the docs' tutorial (docs/tutorial_project/tutorial.sh), every command as the page
#   shows it: migrate, check, a flushed rename, two renames coalesced by the drain, and the
#   tutorial's own tests (pytest, with the plugin found through its pytest11 entry point,
#   and Django's runner: a TestCase with captureOnCommitCallbacks(execute=True)), which
#   must see the deliveries; pytest and pytest-django are installed as the page says;
# - the example project's tests (example_project/accounts/tests.py);
# - a throwaway project with the admin: the shipped migrations match the models, `check`
#   passes at WARNING level, a flushed save and a save left to `drain_outboxes` arrive.
# The wheel file name the docs and READMEs tell users to install must be the one built.
# Everything happens in a temporary directory; the working tree is only read.
#
# Usage: bash scripts/wheel_check.sh [SOURCE_DIR]
# SOURCE_DIR (default: this checkout's files that git tracks or sees, ignored ones left
# out) is the project tree to build, e.g. an export of one commit.
set -euo pipefail
source_dir=${1:+$(cd "$1" && pwd)}
cd "$(dirname "$0")/.."
started=$SECONDS

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
pip_quiet=(--quiet --disable-pip-version-check)

step() { echo "=== $* ($((SECONDS - started)) s)"; }
fail() { echo "wheel_check: FAILED: $*" >&2; exit 1; }

step "tools: build and twine in .venv"
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -c "import build, twine" 2>/dev/null \
  || .venv/bin/python -m pip install "${pip_quiet[@]}" build twine

# Build from a copy of the files git knows (tracked and untracked, ignored ones left out):
# setuptools writes egg-info and build/ next to the sources, and other work in this tree
# must not see that.
step "copy the source tree"
mkdir "$work/src"
if [ -n "$source_dir" ]; then
  cp -a "$source_dir/." "$work/src"
else
  git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -I{} sh -c 'if [ -e "$1" ]; then printf "%s\0" "$1"; fi' _ {} \
    | tar --null -T - -cf - | tar -xf - -C "$work/src"
fi

step "build the sdist, then the wheel from the sdist"
.venv/bin/python -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log"; fail "python -m build"; }
# A packaging rule that matches nothing (a folder gone, a pattern misspelt) only warns.
if grep -i "warning: no \(previously-included \)\?files found matching" "$work/build.log"; then
  fail "python -m build warned about a MANIFEST.in or package-data rule that matches nothing"
fi
sdist=$(ls "$work"/dist/*.tar.gz)
wheel=$(ls "$work"/dist/*.whl)
echo "built $(basename "$sdist") and $(basename "$wheel")"

step "twine check --strict"
.venv/bin/python -m twine check --strict "$sdist" "$wheel"

step "contents of the wheel and the sdist"
.venv/bin/python -m zipfile -l "$wheel" | awk 'NR > 1 { print $1 }' >"$work/wheel.txt"
.venv/bin/python -m tarfile -l "$sdist" | sed -e 's|^[^/]*/||' -e 's/ *$//' >"$work/sdist.txt"
expect() { # expect LISTING PATH...: each path is in the listing
  local listing=$1 path
  shift
  for path in "$@"; do
    grep -qxF "$path" "$work/$listing.txt" || fail "$listing lacks $path"
  done
}
( cd "$work/src" && find outbox/migrations -name '*.py' ) >"$work/migrations.txt"
mapfile -t migrations <"$work/migrations.txt"
expect wheel outbox/py.typed "${migrations[@]}"
# Templates and static files other work adds under outbox/ ship with the wheel too.
if [ -d "$work/src/outbox/templates" ] || [ -d "$work/src/outbox/static" ]; then
  mapfile -t assets < <(cd "$work/src" && find outbox/templates outbox/static -type f 2>/dev/null)
  expect wheel "${assets[@]}"
fi
grep -qE '^django_outboxes-[^/]+\.dist-info/licenses/LICENSE$' "$work/wheel.txt" \
  || fail "wheel lacks the LICENSE in its dist-info"
grep -q '^outbox/tests\|^tests/' "$work/wheel.txt" && fail "wheel ships the tests"
expect sdist LICENSE CHANGELOG.md README.md CONTRIBUTING.md ARCHITECTURE.md pyproject.toml outbox/py.typed \
  "${migrations[@]}" deploy/prometheus/outbox-alerts.yml deploy/prometheus/outbox-alerts.test.yml \
  deploy/grafana/outbox-dashboard.json
echo "wheel: $(wc -l <"$work/wheel.txt") files, ${#migrations[@]} migration modules, py.typed, LICENSE"
echo "sdist: LICENSE, CHANGELOG.md, README.md, CONTRIBUTING.md, ARCHITECTURE.md, migrations, py.typed," \
  "deploy/ (alert rules, dashboard)"

step "fresh virtualenv with only the wheel and its [postgres,example] extras"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install "${pip_quiet[@]}" "$wheel[postgres,example]"
"$py" -c "import psycopg" || fail "the [postgres] extra did not install psycopg"

cd "$work"
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH DJANGO_SETTINGS_MODULE
# The package must come from the fresh virtualenv, never from the working tree.
"$py" -c "
import outbox, sys
from importlib.metadata import version
assert outbox.__file__.startswith(sys.prefix), outbox.__file__
assert outbox.__version__ == version('django-outboxes') != '0+unknown', outbox.__version__
print('outbox', outbox.__version__, 'from', outbox.__file__)
"

step "the install lines of the docs name the wheel just built"
for page in README.md docs/tutorial.md example_project/README.md; do
  grep -qF "dist/$(basename "$wheel")" "$work/src/$page" \
    || fail "$page does not install dist/$(basename "$wheel")"
done

step "the docs' tutorial, as the page shows it, against the wheel alone"
"$py" -m pip install "${pip_quiet[@]}" pytest pytest-django   # the tutorial's step 9
cp -a "$work/src/docs/tutorial_project" "$work/tutorial"
# `python` is the fresh virtualenv's, as after `. .venv/bin/activate`.
( cd "$work/tutorial" && PATH="$work/venv/bin:$PATH" VIRTUAL_ENV="$work/venv" bash tutorial.sh ) \
  >"$work/tutorial.log" 2>&1 || { cat "$work/tutorial.log"; fail "tutorial.sh"; }
cat "$work/tutorial.log"
tutorial_has() { grep -qF "$1" "$work/tutorial.log" || fail "the tutorial did not print: $1"; }
tutorial_has "organization 1 is now called 'Acme Corporation'"   # step 7: flushed
tutorial_has "organization 1 is now called 'Acme Ltd.'"          # step 8: drained
tutorial_has "receiver calls 1, rows retired 2 (1 coalesced), failures 0"
tutorial_has "4 passed"      # step 9: pytest, the plugin's fixtures and the TestCase
tutorial_has "Ran 2 tests"   # step 9: Django's runner, the TestCase alone
grep -q "^plugins:.*django-outboxes" "$work/tutorial.log" \
  || fail "pytest did not load the django-outboxes plugin from its entry point"

step "the example project's tests (OutboxTestMixin in TestCases) against the wheel"
# As example_project/README.md says: run from the project's root, outbox from the wheel.
( cd "$work/src" && "$py" example_project/manage.py test accounts --verbosity 1 ) \
  || fail "the example project's tests"

step "throwaway Django project"
project="$work/project"
mkdir -p "$project/shop"
cat >"$project/settings.py" <<'PY'
import os

SECRET_KEY = "wheel-check"
DEBUG = True
USE_TZ = True
ROOT_URLCONF = "urls"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(os.path.dirname(__file__), "db.sqlite3"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DELIVERIES = os.path.join(os.path.dirname(__file__), "deliveries.txt")
PY
cat >"$project/urls.py" <<'PY'
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
PY
cat >"$project/manage.py" <<'PY'
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
PY
touch "$project/shop/__init__.py"
cat >"$project/shop/outboxes.py" <<'PY'
from outbox import OutboxCategory, OutboxScope


class Category(OutboxCategory):
    NOTE_SAVED = 1


class Scope(OutboxScope):
    NOTES = 0, {Category.NOTE_SAVED}
PY
cat >"$project/shop/apps.py" <<'PY'
from django.apps import AppConfig


def record_delivery(object_identifier, payload, **kwargs):
    from django.conf import settings

    with open(settings.DELIVERIES, "a") as deliveries:
        deliveries.write(f"{object_identifier} {payload['text']}\n")


class ShopConfig(AppConfig):
    name = "shop"

    def ready(self):
        from outbox.signals import process_region_outbox
        from shop.outboxes import Category

        process_region_outbox.connect(record_delivery, sender=Category.NOTE_SAVED)
PY
cat >"$project/shop/models.py" <<'PY'
from django.db import models


class Note(models.Model):
    text = models.CharField(max_length=100)
PY
cat >"$project/save_note.py" <<'PY'
"""python save_note.py TEXT flush|drain: save a note and its outbox row in one transaction."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
import django

django.setup()

from django.db import transaction

from outbox import outbox_context
from outbox.models import RegionOutbox
from shop.models import Note
from shop.outboxes import Category, Scope

text, mode = sys.argv[1:]
with outbox_context(transaction.atomic(), flush=mode == "flush"):
    note = Note.objects.create(text=text)
    RegionOutbox(
        shard_scope=Scope.NOTES,
        shard_identifier=note.id,
        category=Category.NOTE_SAVED,
        object_identifier=note.id,
        payload={"text": text},
    ).save()
print(f"saved note {note.id} ({mode}); rows left: {RegionOutbox.objects.count()}")
PY

cd "$project"

"$py" manage.py makemigrations shop --verbosity 0
"$py" manage.py makemigrations outbox --check --dry-run \
  || fail "the shipped migrations do not match the models"
"$py" manage.py migrate --verbosity 0
"$py" manage.py check --fail-level WARNING

deliveries() { cat deliveries.txt 2>/dev/null || true; }
"$py" save_note.py first flush
[ "$(deliveries)" = "1 first" ] || fail "the flushed save was not delivered: '$(deliveries)'"
"$py" save_note.py second drain
[ "$(deliveries)" = "1 first" ] || fail "a flush=False save was delivered before the drain"
"$py" manage.py drain_outboxes
[ "$(deliveries)" = "$(printf '1 first\n2 second')" ] \
  || fail "the drain did not deliver the second save: '$(deliveries)'"
"$py" manage.py outbox_status

step "wheel check passed: the tutorial and its tests, both deliveries; total"
