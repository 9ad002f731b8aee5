"""Celery draining with real processes: workers, beat, a Redis broker, PostgreSQL.

Every receiver call of a worker is journaled to the Delivery table (tests/celery_app.py),
which is how these tests see order, overlap and duplicates across processes.
"""

import itertools
import os
import time
import uuid
from collections import defaultdict

import pytest
from django.conf import settings
from django.db import transaction

from outbox import outbox_context
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Delivery
from tests.workers import celery_beat, celery_worker, wait_until, worker_env

redis = pytest.importorskip("redis")

pytestmark = [
    committing,
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
        reason="the Celery tests run on PostgreSQL",
    ),
]

BROKER_URL = settings.CELERY_BROKER_URL


@pytest.fixture
def queue():
    """A queue of this test's own on the Redis broker; fails under CI if Redis is down."""
    client = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {BROKER_URL} is required in CI: {exc}")
        pytest.skip(f"Redis at {BROKER_URL} is unreachable: {exc}")
    name = f"outbox-test-{uuid.uuid4().hex[:10]}"
    yield name
    for key in client.scan_iter(f"*{name}*"):
        client.delete(key)
    client.close()


@pytest.fixture
def processes():
    """Processes started by a test, stopped at its end whatever happened."""
    started = []
    yield started
    for process in started:
        process.stop()


def write_rounds(shards: int, rounds: int, pause: float = 0.0) -> None:
    """One transaction per round, writing one message to every shard."""
    for round_ in range(rounds):
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutbox.objects.bulk_create(
                RegionOutbox(
                    shard_scope=Scope.ORGANIZATION,
                    shard_identifier=shard,
                    category=Category.AUDIT_EVENT,
                    object_identifier=shard * 1000 + round_,
                    payload={"round": round_},
                )
                for shard in range(shards)
            )
        time.sleep(pause)


def journal_by_shard() -> dict[int, list[Delivery]]:
    by_shard = defaultdict(list)
    for delivery in Delivery.objects.order_by("started"):
        by_shard[delivery.shard_identifier].append(delivery)
    return by_shard


def assert_each_once_in_order_never_overlapping(shards: int, rounds: int) -> None:
    by_shard = journal_by_shard()
    assert sorted(by_shard) == list(range(shards))
    for shard, deliveries in by_shard.items():
        objects = [delivery.object_identifier for delivery in deliveries]
        assert objects == [shard * 1000 + round_ for round_ in range(rounds)], shard
        for previous, current in itertools.pairwise(deliveries):
            assert current.started >= previous.ended, f"receivers of shard {shard} overlapped"


def test_ten_thousand_messages_across_500_shards(queue, processes, tmp_path):
    env = worker_env(
        OUTBOX_CELERY_QUEUE=queue,
        OUTBOX_CELERY_SCHEDULE_SECONDS=0.5,
        OUTBOX_TASK_SHARDS=25,
    )
    processes.append(celery_worker("one", queue, tmp_path, env, beat=True))
    processes.append(celery_worker("two", queue, tmp_path, env))
    started = time.monotonic()
    write_rounds(shards=500, rounds=20, pause=0.05)
    wait_until(lambda: not RegionOutbox.objects.exists(), timeout=90, message="backlog not drained")
    elapsed = time.monotonic() - started
    assert Delivery.objects.count() == 10_000
    assert_each_once_in_order_never_overlapping(shards=500, rounds=20)
    # Both workers, with both their pool processes, took part.
    assert Delivery.objects.values("process").distinct().count() >= 3
    wait_until(lambda: not ShardLease.objects.exists(), timeout=10)
    print(f"10k messages over 500 shards delivered in {elapsed:.1f}s")


def live_leases_of_drainers():
    """Leases that a drain holds (not the scheduler's reservations of queued tasks)."""
    return ShardLease.objects.held().exclude(holder__startswith="queued:")


def test_sigterm_mid_run_loses_nothing_and_releases_the_leases(queue, processes, tmp_path):
    env = worker_env(
        receiver_delay=0.05,
        OUTBOX_CELERY_QUEUE=queue,
        OUTBOX_CELERY_SCHEDULE_SECONDS=0.5,
        OUTBOX_TASK_SHARDS=4,
        OUTBOX_LEASE_SECONDS=60.0,
    )
    write_rounds(shards=40, rounds=10)
    processes.append(celery_beat(tmp_path, env))
    first = celery_worker("first", queue, tmp_path, env)
    processes.append(first)
    wait_until(lambda: Delivery.objects.count() >= 40, timeout=30)
    wait_until(lambda: live_leases_of_drainers().exists(), timeout=10)  # it holds shards

    exit_seconds = first.terminate()
    terminated = time.monotonic()
    assert first.popen.returncode == 0, first.output()
    # Celery's own warm shutdown of an idle prefork worker takes 2-3 seconds here.
    assert exit_seconds < 10, f"worker took {exit_seconds:.1f}s to exit"
    assert not live_leases_of_drainers().exists(), "a stopped worker kept its leases"
    delivered_by_first = Delivery.objects.count()
    assert delivered_by_first < 400

    processes.append(celery_worker("second", queue, tmp_path, env))
    wait_until(lambda: not RegionOutbox.objects.exists(), timeout=40, message="not finished")
    # Well before the 60-second lease TTL: nothing waited for a lease to expire.
    finished_after = time.monotonic() - terminated
    assert finished_after < 30, f"the rest took {finished_after:.1f}s"
    assert_each_once_in_order_never_overlapping(shards=40, rounds=10)
    print(
        f"SIGTERM'd worker exited in {exit_seconds:.2f}s after {delivered_by_first} deliveries; "
        f"the second worker finished {finished_after:.1f}s after the SIGTERM"
    )


def test_sigterm_stops_past_the_graceful_timeout_and_leaves_the_lease(queue, processes, tmp_path):
    env = worker_env(
        receiver_delay=20.0,
        OUTBOX_CELERY_QUEUE=queue,
        OUTBOX_CELERY_SCHEDULE_SECONDS=0.5,
        OUTBOX_GRACEFUL_TIMEOUT_SECONDS=1.0,
        OUTBOX_LEASE_SECONDS=60.0,
    )
    write_rounds(shards=1, rounds=1)
    processes.append(celery_beat(tmp_path, env))
    worker = celery_worker("stuck", queue, tmp_path, env)
    processes.append(worker)
    wait_until(lambda: live_leases_of_drainers().exists(), timeout=30)
    time.sleep(1.0)  # inside the 20-second receiver
    exit_seconds = worker.terminate()
    assert exit_seconds < 10, f"worker took {exit_seconds:.1f}s to exit"
    # The receiver never finished: its row is kept, and its lease expires by itself.
    assert RegionOutbox.objects.count() == 1
    assert not Delivery.objects.exists()
    assert live_leases_of_drainers().count() == 1


def test_prompt_drain_delivers_without_waiting_for_beat(queue, processes, tmp_path, settings):
    from tests import celery_app  # noqa: F401  the app the prompt drain publishes with

    settings.OUTBOX_PROMPT_DRAIN = "outbox.integrations.celery.prompt_drain"
    settings.OUTBOX_CELERY_QUEUE = queue
    # Beat would take 60 seconds: anything delivered sooner came through the prompt path.
    env = worker_env(OUTBOX_CELERY_QUEUE=queue, OUTBOX_CELERY_SCHEDULE_SECONDS=60.0)
    processes.append(celery_worker("prompt", queue, tmp_path, env, beat=True))
    committed = {}
    for n in range(20):
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutbox(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=n,
                category=Category.AUDIT_EVENT,
                object_identifier=n,
                payload={"n": n},
            ).save()
            committed[n] = time.monotonic()
        time.sleep(0.05)
    wait_until(lambda: Delivery.objects.count() == 20, timeout=15, message="not delivered")
    latencies = sorted(
        delivery.started - committed[delivery.object_identifier]
        for delivery in Delivery.objects.all()
    )
    assert latencies[-1] < 5, latencies
    print(f"prompt drain latency: median {latencies[10]:.3f}s, max {latencies[-1]:.3f}s")


def test_a_pool_process_is_a_live_drain_from_its_first_outbox_task(queue, processes, tmp_path):
    """Its beacon starts with the first outbox task it runs (here beat's schedule_drains)
    and deletes its records as the pool process shuts down (warm shutdown)."""
    from outbox.models import OutboxDrainProcess

    env = worker_env(
        OUTBOX_CELERY_QUEUE=queue,
        OUTBOX_CELERY_SCHEDULE_SECONDS=0.5,
        OUTBOX_DRAIN_BEACON_SECONDS=30.0,  # a record that would outlive the test
    )
    worker = celery_worker("beacon", queue, tmp_path, env, beat=True, concurrency=1)
    processes.append(worker)
    records = OutboxDrainProcess.objects.filter(kind="celery")
    wait_until(records.exists, timeout=20, message=worker.output())
    [record] = records
    assert record.pid != worker.pid  # the pool process that ran the task
    assert OutboxDrainProcess.objects.using("control").get().pid == record.pid
    worker.terminate()
    assert not OutboxDrainProcess.objects.using("default").exists(), worker.output()
    assert not OutboxDrainProcess.objects.using("control").exists()
