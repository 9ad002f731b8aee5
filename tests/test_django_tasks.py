"""The drain as Django Tasks (Django 6): on the immediate backend in-process, and on
django-tasks-db's database backend with its `db_worker` as a real process."""

import importlib.util
import sys

import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.models import Delivery
from tests.workers import Process, wait_until, worker_env

pytest.importorskip("django.tasks", reason="Django Tasks needs Django 6")

from outbox.integrations import django_tasks

pytestmark = committing

needs_db_worker = pytest.mark.skipif(
    importlib.util.find_spec("django_tasks_db") is None, reason="needs django-tasks-db"
)


def test_schedule_drains_fans_out_and_drains_on_the_immediate_backend(calls, settings):
    settings.OUTBOX_TASK_SHARDS = 2
    for shard in range(5):
        RegionOutboxFactory(shard_identifier=shard)
        ControlOutboxFactory(shard_identifier=shard)
    result = django_tasks.enqueue(django_tasks.schedule_drains)
    assert result.return_value == 6  # three orders per table
    assert len(calls.calls) == 10
    assert not RegionOutbox.objects.exists() and not ControlOutbox.objects.exists()
    assert not ShardLease.objects.exists()


def test_drain_all_task(calls):
    RegionOutboxFactory(shard_identifier=1)
    ControlOutboxFactory(shard_identifier=1)
    result = django_tasks.enqueue(django_tasks.drain_all)
    assert result.return_value["receiver_calls"] == 2
    assert len(calls.calls) == 2


def test_prompt_drain_delivers_right_after_commit(calls, settings):
    settings.OUTBOX_PROMPT_DRAIN = "outbox.integrations.django_tasks.prompt_drain"
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(shard_identifier=1, payload={"v": 1})
        assert calls.calls == []
    assert calls.payloads() == [{"v": 1}]


def db_worker(tmp_path, receiver_delay=0.0, **settings):
    args = [
        sys.executable, "-m", "django", "db_worker", "--settings=tests.settings",
        "--backend", "database", "--queue-name", "default", "--interval", "0.1",
    ]  # fmt: skip
    env = worker_env(receiver_delay, OUTBOX_TASKS_BACKEND="database", **settings)
    process = Process(args, env, tmp_path / "db_worker.log")
    process.wait_for_output("Starting worker")
    return process


@needs_db_worker
@server_database_only
def test_db_worker_drains_scheduled_and_prompted_shards(settings, tmp_path):
    settings.OUTBOX_TASKS_BACKEND = "database"
    settings.OUTBOX_TASK_SHARDS = 5
    for shard in range(20):
        for n in range(3):
            RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 10 + n)
    worker = db_worker(tmp_path, OUTBOX_TASK_SHARDS=5)
    try:
        django_tasks.enqueue(django_tasks.schedule_drains)
        wait_until(lambda: not RegionOutbox.objects.exists(), timeout=30)
        settings.OUTBOX_PROMPT_DRAIN = "outbox.integrations.django_tasks.prompt_drain"
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutboxFactory(shard_identifier=99, object_identifier=990)
        wait_until(lambda: not RegionOutbox.objects.exists(), timeout=30)
    finally:
        worker.stop()
    assert Delivery.objects.count() == 61
    for shard in [*range(20), 99]:
        objects = list(
            Delivery.objects.filter(shard_identifier=shard)
            .order_by("started")
            .values_list("object_identifier", flat=True)
        )
        assert objects == sorted(objects) and objects
    assert not ShardLease.objects.exists()


@needs_db_worker
@server_database_only
def test_db_worker_sigterm_stops_the_drain_gracefully(settings, tmp_path):
    settings.OUTBOX_TASKS_BACKEND = "database"
    for n in range(20):
        RegionOutboxFactory(shard_identifier=1, object_identifier=n)
    worker = db_worker(tmp_path, receiver_delay=0.2)
    try:
        django_tasks.enqueue(django_tasks.drain_all)
        wait_until(lambda: Delivery.objects.count() >= 2, timeout=30)
        exit_seconds = worker.terminate()
    finally:
        worker.stop()
    assert exit_seconds < 3, worker.output()
    delivered = Delivery.objects.count()
    assert 2 <= delivered < 20
    assert RegionOutbox.objects.count() == 20 - delivered  # the in-flight one finished
    assert not ShardLease.objects.exists()


def test_the_first_outbox_task_of_a_process_records_it_as_a_live_drain(settings):
    from outbox.health.beacon import running_beacon, stop_drain_beacon
    from outbox.models import OutboxDrainProcess

    settings.OUTBOX_DRAIN_BEACON_SECONDS = 30.0
    try:
        django_tasks.enqueue(django_tasks.drain_all)
        beacon = running_beacon()
        assert beacon is not None and beacon.kind == "django-tasks"
        for alias in ("default", "control"):
            records = OutboxDrainProcess.objects.using(alias).filter(kind="django-tasks")
            wait_until(records.exists, timeout=10)
    finally:
        stop_drain_beacon()
    assert not OutboxDrainProcess.objects.using("default").exists()
    assert not OutboxDrainProcess.objects.using("control").exists()
