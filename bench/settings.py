"""Django settings of the benchmark: PostgreSQL, the `outbox` app and the `bench` app.

Connection: PGHOST, PGPORT, PGUSER, PGPASSWORD (defaults 127.0.0.1:5432, postgres).
Database: OUTBOX_BENCH_DB (default `outbox_bench`; the harness creates it).
Batch size of every contender: OUTBOX_BENCH_BATCH_ROWS and OUTBOX_BENCH_BATCH_SHARDS,
set by `python -m bench` before Django starts, so worker processes inherit them;
OUTBOX_BENCH_FAST_PATH=0 (`--portable`) turns the engine's PostgreSQL fast path off.
"""

from __future__ import annotations

import importlib.util
import os
import sys

SECRET_KEY = "outbox-bench"
DEBUG = False  # DEBUG would log every query in memory and slow every contender down
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

HAS_PROCRASTINATE = importlib.util.find_spec("procrastinate") is not None
# The peer outboxes (bench/contenders/domain_events.py, reliable_outbox.py), each in the
# run only when installed. django-reliable-outbox needs Python 3.12+.
HAS_DOMAIN_EVENTS = importlib.util.find_spec("django_domain_events") is not None
HAS_RELIABLE_OUTBOX = (
    sys.version_info >= (3, 12) and importlib.util.find_spec("reliable_outbox") is not None
)

INSTALLED_APPS = [
    "outbox",
    "bench",
    *(["procrastinate.contrib.django"] if HAS_PROCRASTINATE else []),
    # django-domain-events requires auth (its event row has a nullable user key).
    *(
        ["django.contrib.contenttypes", "django.contrib.auth", "django_domain_events"]
        if HAS_DOMAIN_EVENTS
        else []
    ),
    *(["reliable_outbox"] if HAS_RELIABLE_OUTBOX else []),
]
# The relay's idle prune sweep is housekeeping, not delivery (it deletes nothing here).
DJANGO_DOMAIN_EVENTS = {"RELAY_PRUNE": False}

_DATABASE = {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": os.environ.get("OUTBOX_BENCH_DB", "outbox_bench"),
    "USER": os.environ.get("PGUSER", "postgres"),
    "PASSWORD": os.environ.get("PGPASSWORD", ""),
    "HOST": os.environ.get("PGHOST", "127.0.0.1"),
    "PORT": os.environ.get("PGPORT", "5432"),
}
DATABASES = {
    # OUTBOX_BENCH_PREPARED=1: server-side binding with prepared statements (Django
    # leaves them off by default, for connection poolers).
    "default": {
        **_DATABASE,
        "OPTIONS": (
            {"server_side_binding": True, "prepare_threshold": 2}
            if os.environ.get("OUTBOX_BENCH_PREPARED") == "1"
            else {}
        ),
    },
    # The same database on a connection that prepares statements (at first use) while
    # binding parameters client-side, as Django does: the synchronous flush is measured
    # on both.
    "prepared": {**_DATABASE, "OPTIONS": {"prepare_threshold": 0}},
}

OUTBOX_BATCH_ROWS = int(os.environ.get("OUTBOX_BENCH_BATCH_ROWS", "2000"))
OUTBOX_BATCH_SHARDS = int(os.environ.get("OUTBOX_BENCH_BATCH_SHARDS", "100"))
if os.environ.get("OUTBOX_BENCH_FAST_PATH") == "0":  # `python -m bench --portable`
    OUTBOX_FAST_PATH = False
# Errors must surface: the bench checks every drained row reached its receiver.
OUTBOX_FLUSH_STRICT = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"procrastinate": {"level": "WARNING"}},
}
