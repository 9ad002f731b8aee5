"""Commit-to-receiver latency of asynchronous delivery (`outbox_context(flush=False)`)
through Celery, without and with the prompt drain (OUTBOX_PROMPT_DRAIN).

Needs PostgreSQL (PGHOST etc., default 127.0.0.1 as postgres) and Redis
(OUTBOX_TEST_BROKER_URL, default redis://127.0.0.1:6379/14). It creates the databases
outbox_latency and outbox_latency_control, starts one Celery worker (2 processes) with
beat at the default interval of OUTBOX_CELERY_SCHEDULE_SECONDS, commits single-row
transactions at a steady pace, and reads when each row's receiver started from the
test app's journal (monotonic clock, shared by the processes of one machine).

    .venv/bin/python scripts/measure_async_latency.py [--messages 200] [--interval 0.05]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["OUTBOX_TEST_DB"] = "postgres"
os.environ["OUTBOX_TEST_DATABASE_NAMES"] = "default=outbox_latency,control=outbox_latency_control"
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
QUEUE = f"outbox-latency-{uuid.uuid4().hex[:8]}"
os.environ["OUTBOX_TEST_CELERY_QUEUE"] = QUEUE

import django  # noqa: E402
import psycopg  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from outbox import outbox_context  # noqa: E402
from outbox.conf import outbox_settings  # noqa: E402
from outbox.models import RegionOutbox, ShardLease  # noqa: E402
from tests import celery_app  # noqa: E402, F401  the app prompt drains publish with
from tests.testapp.categories import Category, Scope  # noqa: E402
from tests.testapp.models import Delivery  # noqa: E402
from tests.workers import celery_worker, wait_until, worker_env  # noqa: E402


def create_databases() -> None:
    admin = settings.DATABASES["default"]
    with psycopg.connect(
        host=admin["HOST"], port=admin["PORT"], user=admin["USER"], password=admin["PASSWORD"],
        dbname="postgres", autocommit=True,
    ) as connection:  # fmt: skip
        for alias in ("default", "control"):
            name = settings.DATABASES[alias]["NAME"]
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if not exists.fetchone():
                connection.execute(f'CREATE DATABASE "{name}"')
    for alias in ("default", "control"):
        call_command("migrate", database=alias, verbosity=0)


def empty_tables() -> None:
    for alias in ("default", "control"):
        Delivery.objects.using(alias).all().delete()
        RegionOutbox.objects.using(alias).all().delete()
        ShardLease.objects.using(alias).all().delete()


def measure(messages: int, interval: float) -> list[float]:
    """Commit `messages` single-row transactions; return their latencies in seconds."""
    empty_tables()
    committed = {}
    for n in range(messages):
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutbox(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=n,
                category=Category.AUDIT_EVENT,
                object_identifier=n,
                payload={"n": n},
            ).save()
            # The commit happens on leaving this block; the prompt drain's publish after it
            # counts as latency.
            committed[n] = time.monotonic()
        time.sleep(interval)
    wait_until(lambda: Delivery.objects.count() >= messages, timeout=120, interval=0.2)
    started = dict(Delivery.objects.values_list("object_identifier", "started"))
    return sorted(started[n] - committed[n] for n in range(messages))


def report(label: str, latencies: list[float]) -> None:
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"{label:<22} median {statistics.median(latencies) * 1000:8.1f} ms   "
        f"p99 {p99 * 1000:8.1f} ms   max {latencies[-1] * 1000:8.1f} ms   (n={len(latencies)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between commits")
    options = parser.parse_args()
    create_databases()
    with tempfile.TemporaryDirectory() as tmp, override_settings(OUTBOX_CELERY_QUEUE=QUEUE):
        beat = float(outbox_settings.CELERY_SCHEDULE_SECONDS)
        env = worker_env(OUTBOX_CELERY_QUEUE=QUEUE)
        worker = celery_worker("latency", QUEUE, Path(tmp), env, beat=True)
        try:
            print(f"beat every {beat}s, {options.messages} commits {options.interval}s apart")
            report("beat only", measure(options.messages, options.interval))
            with override_settings(OUTBOX_PROMPT_DRAIN="outbox.integrations.celery.prompt_drain"):
                report("with prompt drain", measure(options.messages, options.interval))
        finally:
            worker.stop()
            connections.close_all()


if __name__ == "__main__":
    main()
