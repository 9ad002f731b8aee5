"""OUTBOX_TASK_LIVENESS_FILE: a Celery or Django Tasks worker keeps a file fresh for a
liveness probe, busy or idle, and lets it age while one of its drains is stuck past its
budget and the graceful timeout (a receiver call that does not return)."""

import threading
import time

import pytest
from celery import signals as celery_signals

from outbox.engine import DrainWorker
from outbox.integrations import celery  # noqa: F401  (connects its worker signals)
from outbox.integrations.task_liveness import (
    TaskLiveness,
    overrun_drains,
    running_task_liveness,
    start_task_liveness,
    stop_task_liveness,
)
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.workers import wait_until


@pytest.fixture(autouse=True)
def no_liveness():
    stop_task_liveness()
    yield
    stop_task_liveness()


def mtime(path):
    return path.stat().st_mtime_ns if path.exists() else None


def test_the_file_is_touched_again_and_again_while_idle(tmp_path):
    alive = tmp_path / "alive"
    liveness = TaskLiveness(str(alive), every=0.05).start()
    try:
        wait_until(alive.exists, 5)
        first = mtime(alive)
        wait_until(lambda: mtime(alive) != first, 5)
    finally:
        liveness.stop(5)


@committing
def test_a_drain_stuck_past_its_budget_and_grace_lets_the_file_age(calls, settings, tmp_path):
    settings.OUTBOX_GRACEFUL_TIMEOUT_SECONDS = 0.2
    alive = tmp_path / "alive"
    RegionOutboxFactory(shard_identifier=1)
    release = threading.Event()
    calls.during_call = lambda sender, kwargs: release.wait(20)  # a call that hangs
    worker = DrainWorker(max_seconds=0.3)
    drain = threading.Thread(target=worker.run)
    liveness = TaskLiveness(str(alive), every=0.1).start()
    try:
        wait_until(alive.exists, 5)
        drain.start()
        wait_until(lambda: overrun_drains(0.1) == [worker], 5)  # 0.3 + 0.2 + 0.1 s on
        stale = mtime(alive)
        time.sleep(0.5)
        assert mtime(alive) == stale  # no touch while the drain is stuck
    finally:
        release.set()
        drain.join(10)
    try:
        wait_until(lambda: mtime(alive) != stale, 5)  # touched again once it ended
        assert not RegionOutbox.objects.exists()
    finally:
        liveness.stop(5)


@committing
def test_a_drain_within_its_budget_is_not_overrun(calls, settings):
    settings.OUTBOX_GRACEFUL_TIMEOUT_SECONDS = 0.2
    RegionOutboxFactory(shard_identifier=1)
    release = threading.Event()
    calls.during_call = lambda sender, kwargs: release.wait(20)
    worker = DrainWorker(max_seconds=30)
    drain = threading.Thread(target=worker.run)
    drain.start()
    try:
        wait_until(lambda: worker in DrainWorker.running(), 5)
        time.sleep(0.3)
        assert overrun_drains(0.1) == []
    finally:
        release.set()
        drain.join(10)


def test_nothing_runs_while_the_setting_is_unset():
    assert start_task_liveness() is None


def test_a_celery_worker_starts_it_when_ready(settings, tmp_path):
    settings.OUTBOX_TASK_LIVENESS_FILE = str(tmp_path / "alive")
    celery_signals.worker_ready.send(sender=None)
    liveness = running_task_liveness()
    assert liveness is not None
    assert start_task_liveness() is liveness  # one per process
    wait_until((tmp_path / "alive").exists, 5)


@committing
def test_a_django_tasks_worker_starts_it_with_its_first_outbox_task(settings, tmp_path):
    pytest.importorskip("django.tasks", reason="Django Tasks needs Django 6")
    from outbox.integrations import django_tasks

    settings.OUTBOX_TASK_LIVENESS_FILE = str(tmp_path / "alive")
    django_tasks.drain_all.call()
    assert running_task_liveness() is not None
