"""Django settings of the stress run. STRESS_DB=postgres|mariadb picks the server.

Connection: PGHOST/PGPORT/PGUSER/PGPASSWORD or MYSQL_HOST/MYSQL_PORT/MYSQL_USER/
MYSQL_PASSWORD (defaults 127.0.0.1, postgres / root, no password). Database:
STRESS_DB_NAME (default `outbox_stress`; the runner creates it). STRESS_PROCESS names
the process in the journal and in the connection registry (faults find it there).
STRESS_UNSETTLED_SECONDS, if set, is OUTBOX_UNSETTLED_SECONDS (else the default).
"""

from __future__ import annotations

import os

SECRET_KEY = "outbox-stress"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["outbox", "stress"]

STRESS_DB = os.environ.get("STRESS_DB", "postgres")
_NAME = os.environ.get("STRESS_DB_NAME", "outbox_stress")

if STRESS_DB == "postgres":
    _default = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _NAME,
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "OPTIONS": {"application_name": os.environ.get("STRESS_PROCESS", "stress")[:60]},
    }
elif STRESS_DB == "mariadb":
    _default = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": _NAME,
        "USER": os.environ.get("MYSQL_USER", "root"),
        "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
        "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("MYSQL_PORT", "3306"),
        "OPTIONS": {"charset": "utf8mb4", "init_command": "SET time_zone = '+00:00'"},
    }
else:
    raise RuntimeError(f"STRESS_DB={STRESS_DB!r}: use postgres or mariadb")
DATABASES = {"default": _default}

# Short leases and back-off so faults heal within seconds.
OUTBOX_LEASE_SECONDS = float(os.environ.get("STRESS_LEASE_SECONDS", "5"))
OUTBOX_RECEIVER_DEADLINE_SECONDS = 3.0
OUTBOX_BACKOFF_BASE_SECONDS = 0.1
OUTBOX_BACKOFF_MAX_SECONDS = 1.0
OUTBOX_LOOP_INTERVAL_SECONDS = 0.2
OUTBOX_BATCH_SHARDS = 20
# Drainers deliver on slot threads; the hang fault (12 s) outlives the receiver timeout.
OUTBOX_CONCURRENCY = int(os.environ.get("STRESS_CONCURRENCY", "8"))
OUTBOX_RECEIVER_TIMEOUT_SECONDS = 8.0
OUTBOX_GRACEFUL_TIMEOUT_SECONDS = 10.0
# The bound on delivered, unsettled work per drain (#32): the default unless set.
if os.environ.get("STRESS_UNSETTLED_SECONDS"):
    OUTBOX_UNSETTLED_SECONDS = float(os.environ["STRESS_UNSETTLED_SECONDS"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"outbox": {"handlers": ["console"], "level": "WARNING"}},
}
