"""Django settings of the backfill bench. OUTBOX_BENCH_BACKFILL_DB picks the database:
postgres (PGHOST, PGPORT, PGUSER, PGPASSWORD, as `bench.settings`), mariadb (MYSQL_HOST,
MYSQL_PORT, MYSQL_USER, MYSQL_PASSWORD, as `bench.settings_mariadb`) or sqlite (a file in
the temporary directory). The database is `outbox_bench_backfill`, made afresh by
`python -m bench.backfill`."""

from __future__ import annotations

import os
import tempfile

SECRET_KEY = "outbox-bench"
DEBUG = False  # DEBUG would keep every query in memory
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["outbox", "bench.backfill"]

NAME = "outbox_bench_backfill"
VENDOR = os.environ.get("OUTBOX_BENCH_BACKFILL_DB", "postgres")
if VENDOR == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME,
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    }
elif VENDOR == "mariadb":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4", "init_command": "SET time_zone = '+00:00'"},
        }
    }
elif VENDOR == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(tempfile.gettempdir(), f"{NAME}.sqlite3"),
        }
    }
else:
    raise RuntimeError(f"OUTBOX_BENCH_BACKFILL_DB={VENDOR!r}: use postgres, mariadb or sqlite")

# Errors must surface: the bench checks that every object's message reached its receiver.
OUTBOX_FLUSH_STRICT = True
