#!/usr/bin/env bash
# Release check: build the sdist and the wheel, `twine check --strict` them, check what the
# wheel ships, then install ONLY the wheel (with the [postgres] extra) into a fresh
# virtualenv and run a throwaway Django project against it: migrate, check, a flushed save,
# a save left to `drain_outboxes`, both delivered. Everything happens in a temporary
# directory; the working tree is only read.
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
expect sdist LICENSE CHANGELOG.md README.md ARCHITECTURE.md pyproject.toml outbox/py.typed \
  "${migrations[@]}"
echo "wheel: $(wc -l <"$work/wheel.txt") files, ${#migrations[@]} migration modules, py.typed, LICENSE"
echo "sdist: LICENSE, CHANGELOG.md, README.md, ARCHITECTURE.md, migrations, py.typed"

step "fresh virtualenv with only the wheel and its [postgres] extra"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install "${pip_quiet[@]}" "$wheel[postgres]"
"$py" -c "import psycopg" || fail "the [postgres] extra did not install psycopg"

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

step "wheel check passed: both deliveries arrived; total"
