"""Settings of the test suite; OUTBOX_TEST_DB picks sqlite (default), postgres or mariadb
(or postgres-portable, mariadb-portable: the portable path on that database)."""

import json
import os

SECRET_KEY = "outbox-tests"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox",
    "tests.testapp",
]

TEST_DB = os.environ.get("OUTBOX_TEST_DB", "sqlite")
# "postgres-portable" and "mariadb-portable" run the database through the portable path
# instead of its fast path.
OUTBOX_FAST_PATH = not TEST_DB.endswith("-portable")
TEST_DB = TEST_DB.removesuffix("-portable")


def _database(name: str) -> dict:
    if TEST_DB == "sqlite":
        suffix = os.environ.get("OUTBOX_TEST_DB_SUFFIX", "")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{name}{suffix}.sqlite3"}
    if TEST_DB == "postgres":
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            # OUTBOX_TEST_PREPARED=1: the engine prepares its statements (at first use).
            "OPTIONS": (
                {"prepare_threshold": 0} if os.environ.get("OUTBOX_TEST_PREPARED") == "1" else {}
            ),
        }
    if TEST_DB == "mariadb":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            # Now() is the session clock: keep it in UTC, as Django stores datetimes.
            "OPTIONS": {"charset": "utf8mb4", "init_command": "SET time_zone = '+00:00'"},
        }
    raise RuntimeError(f"OUTBOX_TEST_DB={TEST_DB!r}: use sqlite, postgres or mariadb")


DATABASES = {"default": _database("outbox"), "control": _database("outbox_control")}
DATABASE_ROUTERS = ["tests.testapp.routers.ControlRouter"]

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
ROOT_URLCONF = "tests.urls"

# Short back-off so retry tests do not wait long; leases long enough for slow CI.
OUTBOX_BACKOFF_BASE_SECONDS = 30.0
OUTBOX_LEASE_SECONDS = 30.0
# The suite pins batches and statements of a drain on its own thread, as
# `--concurrency 1` runs it; tests/test_slots.py covers delivery on slot threads.
OUTBOX_CONCURRENCY = 1
# No drain beacon: a thread of its own writing to the test databases would outlive the
# tests that start a drain. The tests of the beacon turn it on, in a subprocess or with
# the beacon stopped before they end (tests/test_drain_processes.py).
OUTBOX_DRAIN_BEACON_SECONDS = 0

# Tests that start worker processes (Celery, drain_outboxes) point them at the test
# databases pytest created ("default=test_outbox,control=test_outbox_control"), and may
# hand them settings as JSON.
for _alias, _name in (
    item.split("=", 1)
    for item in os.environ.get("OUTBOX_TEST_DATABASE_NAMES", "").split(",")
    if item
):
    DATABASES[_alias]["NAME"] = _name
globals().update(json.loads(os.environ.get("OUTBOX_TEST_SETTINGS", "{}")))
# Separate test databases for test runs side by side on one server ("_mine").
if os.environ.get("OUTBOX_TEST_DB_SUFFIX") and TEST_DB != "sqlite":
    for _config in DATABASES.values():
        _config["TEST"] = {"NAME": f"test_{_config['NAME']}{os.environ['OUTBOX_TEST_DB_SUFFIX']}"}

CELERY_BROKER_URL = os.environ.get("OUTBOX_TEST_BROKER_URL", "redis://127.0.0.1:6379/14")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("OUTBOX_TEST_CELERY_QUEUE", "outbox-tests")
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Django 6: the Django Tasks tests run the outbox tasks on the immediate backend and, with
# django-tasks-db installed (the Django 6 tox envs), on its database backend and worker.
try:
    import django
    import django_tasks_db  # noqa: F401
except ImportError:
    pass
else:
    if django.VERSION >= (6,):
        INSTALLED_APPS.append("django_tasks_db")
        TASKS = {
            "default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
            "database": {"BACKEND": "django_tasks_db.DatabaseBackend"},
        }
