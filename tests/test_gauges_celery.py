"""A real Celery worker (prefork, with beat, Prometheus in multiprocess mode) reads the
health gauges on its timer and keeps its liveness file fresh, with no drain to do."""

import struct
import time

import pytest
from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from outbox.metrics.refresh import LOCK_NAME
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.test_celery import processes, queue  # noqa: F401  (fixtures)
from tests.workers import celery_worker, wait_until, worker_env

pytestmark = [
    committing,
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
        reason="the Celery tests run on PostgreSQL",
    ),
]


def dead_letters(directory):
    """What a /metrics endpoint serving `directory` would show."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    labels = {"table": "outbox.RegionOutbox", "scope": "ORGANIZATION"}
    try:
        return registry.get_sample_value("outbox_dead_letters", labels)
    except struct.error:  # a worker process is creating its file at this moment: empty
        return None


def test_a_celery_worker_reads_the_gauges_on_its_timer(queue, processes, tmp_path):  # noqa: F811
    multiproc, alive = tmp_path / "prometheus", tmp_path / "alive"
    multiproc.mkdir()
    env = worker_env(
        OUTBOX_CELERY_QUEUE=queue,
        OUTBOX_CELERY_SCHEDULE_SECONDS=0.5,
        OUTBOX_METRICS="prometheus",
        OUTBOX_METRICS_REFRESH_SECONDS=0.3,
        OUTBOX_TASK_LIVENESS_FILE=str(alive),
    )
    env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    processes.append(celery_worker("gauges", queue, tmp_path, env, beat=True))
    wait_until(alive.exists, 30, message="no liveness file")
    RegionOutboxFactory()
    RegionOutbox.objects.update(dead_at=timezone.now())  # nothing for a drain to do
    wait_until(lambda: dead_letters(multiproc) == 1, 30, message="gauge not read")
    assert (multiproc / LOCK_NAME).exists()  # the pool processes took turns
    RegionOutbox.objects.all().delete()
    wait_until(lambda: dead_letters(multiproc) == 0, 30, message="gauge not read again")
    touched = alive.stat().st_mtime
    time.sleep(6)  # the liveness thread touches every 5 seconds
    assert alive.stat().st_mtime > touched
