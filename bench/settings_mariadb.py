"""Django settings of the benchmark's MariaDB section (`bench.mariadb`), which runs in a
child process of its own: MariaDB, the `outbox` app and the `bench` app.

Connection: MYSQL_HOST, MYSQL_PORT, MYSQL_USER, MYSQL_PASSWORD (defaults 127.0.0.1:3306,
root, no password), as the test suite. Database: OUTBOX_BENCH_MARIADB_DB (the section
creates it afresh). Batch sizes: OUTBOX_BENCH_BATCH_ROWS and OUTBOX_BENCH_BATCH_SHARDS,
as for the PostgreSQL contenders.
"""

from __future__ import annotations

import os

SECRET_KEY = "outbox-bench"
DEBUG = False  # DEBUG would log every query in memory and slow every contender down
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["outbox", "bench"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": os.environ.get("OUTBOX_BENCH_MARIADB_DB", "outbox_bench"),
        "USER": os.environ.get("MYSQL_USER", "root"),
        "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
        "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("MYSQL_PORT", "3306"),
        # Now() is the session clock: keep it in UTC, as Django stores datetimes.
        "OPTIONS": {"charset": "utf8mb4", "init_command": "SET time_zone = '+00:00'"},
    }
}

OUTBOX_BATCH_ROWS = int(os.environ.get("OUTBOX_BENCH_BATCH_ROWS", "2000"))
OUTBOX_BATCH_SHARDS = int(os.environ.get("OUTBOX_BENCH_BATCH_SHARDS", "100"))
# Errors must surface: the bench checks every drained row reached its receiver.
OUTBOX_FLUSH_STRICT = True
