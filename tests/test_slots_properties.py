"""A property test of delivery on slots: random backlogs, receiver delays, slot counts
and numbers of workers (real threads, each its own drain) must give every coalescing
group exactly one call, with its newest payload, in order of its oldest row per shard,
never two calls of one shard at once."""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict

from django.conf import settings as django_settings
from django.db import connections
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from outbox.engine.drain import Drainer
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = [committing]

backlogs = st.lists(  # per shard: the object of each row, in write order
    st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=5),
    min_size=1,
    max_size=10,
)


@hypothesis_settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    backlog=backlogs,
    delays_ms=st.lists(st.sampled_from([0, 0, 2, 15]), min_size=10, max_size=10),
    concurrency=st.integers(min_value=1, max_value=6),
    # SQLite takes one writer at a time: several drains at once fail with "locked".
    workers=st.integers(min_value=1, max_value=1 if django_settings.TEST_DB == "sqlite" else 3),
    straggler=st.booleans(),
)
def test_slots_and_workers_keep_order_coalescing_and_single_delivery(
    calls, settings, backlog, delays_ms, concurrency, workers, straggler
):
    """`straggler`: shard 0's first call takes long enough to be carved out of its
    window and settled on its own."""
    settings.OUTBOX_CONCURRENCY = concurrency
    settings.OUTBOX_BATCH_SHARDS = 3  # several batches, so workers share the shards
    RegionOutbox.objects.all().delete()
    ShardLease.objects.all().delete()
    expected = write(backlog)
    calls.reset()
    entries = []
    lock = threading.Lock()

    slow_once = threading.Event()

    def during_call(sender, kwargs):
        started = time.monotonic()
        shard = kwargs["shard_identifier"]
        if straggler and shard == 0 and not slow_once.is_set():
            slow_once.set()
            time.sleep(0.7)
        time.sleep(delays_ms[shard] / 1000)
        with lock:
            entries.append((kwargs, started, time.monotonic()))

    calls.during_call = during_call
    run_workers(workers)
    by_shard = defaultdict(list)
    for kwargs, started, ended in sorted(entries, key=lambda entry: entry[1]):
        by_shard[kwargs["shard_identifier"]].append((kwargs, started, ended))
    for shard, shard_calls in by_shard.items():
        for previous, current in itertools.pairwise(shard_calls):
            assert current[1] >= previous[2], f"two calls of shard {shard} overlapped"
        delivered = [(c[0]["object_identifier"], c[0]["payload"]["n"]) for c in shard_calls]
        assert delivered == expected[shard], f"shard {shard}"
    assert set(by_shard) == set(expected)
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def write(backlog: list[list[int]]) -> dict[int, list[tuple[int, int]]]:
    """Write the backlog; per shard, the expected calls: (object, newest row's n) per
    group, in order of each group's oldest row."""
    expected = {}
    rows = []
    for shard, objects in enumerate(backlog):
        newest = {}
        for n, obj in enumerate(objects):
            newest[obj] = n  # dicts keep first-insertion order: the oldest row's
            rows.append(
                RegionOutboxFactory.build(
                    shard_identifier=shard, object_identifier=obj, payload={"n": n}
                )
            )
        expected[shard] = list(newest.items())
    RegionOutbox.objects.bulk_create(rows)
    return expected


def run_workers(count: int) -> None:
    errors = []

    def drain_until_empty() -> None:
        try:
            for _ in range(200):
                Drainer(RegionOutbox).drain()
                if not RegionOutbox.objects.exists():
                    return
                time.sleep(0.01)
            raise AssertionError("backlog did not drain")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drain_until_empty) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
