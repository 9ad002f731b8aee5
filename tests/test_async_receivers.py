"""`async def` receivers: awaited on the drain's own event loop, concurrently across
shards; cancelled at the receiver timeout; still delivered by a synchronous flush."""

import asyncio
import threading
import time

import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from outbox.signals import process_region_outbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category

pytestmark = [committing]


class AsyncCalls:
    def __init__(self, seconds=0.0):
        self.seconds = seconds
        self.entries = []  # (shard, thread name, loop id, started, ended)
        self.cancelled = []

    async def receive(self, sender, shard_identifier, **kwargs):
        started = time.monotonic()
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled.append(shard_identifier)
            raise
        loop = id(asyncio.get_running_loop())
        thread = threading.current_thread().name
        self.entries.append((shard_identifier, thread, loop, started, time.monotonic()))


@pytest.fixture
def async_receiver():
    connected = []

    def connect(receiver):
        function = receiver.receive if isinstance(receiver, AsyncCalls) else receiver
        process_region_outbox.connect(function, sender=Category.AUDIT_EVENT, weak=False)
        connected.append(function)
        return receiver

    yield connect
    for receiver in connected:
        process_region_outbox.disconnect(receiver, sender=Category.AUDIT_EVENT)


def write(shards):
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=n, object_identifier=n) for n in range(shards)]
    )


def test_async_receivers_are_awaited_concurrently_on_the_drains_loop(
    calls, settings, async_receiver
):
    settings.OUTBOX_CONCURRENCY = 8
    receiver = async_receiver(AsyncCalls(seconds=0.2))
    write(8)
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 8
    assert sorted(entry[0] for entry in receiver.entries) == list(range(8))
    assert {entry[1] for entry in receiver.entries} == {"outbox-event-loop"}
    assert len({entry[2] for entry in receiver.entries}) == 1  # one loop for the drain
    first_end = min(entry[4] for entry in receiver.entries)
    assert sum(entry[3] < first_end for entry in receiver.entries) >= 2  # overlapped
    assert not any(t.name == "outbox-event-loop" for t in threading.enumerate())


def test_sync_and_async_receivers_of_one_signal_both_run_sync_first(
    calls, settings, async_receiver
):
    settings.OUTBOX_CONCURRENCY = 4
    order = []
    calls.during_call = lambda sender, kwargs: order.append((kwargs["shard_identifier"], "sync"))

    async def second(sender, shard_identifier, **kwargs):
        order.append((shard_identifier, "async"))

    async_receiver(second)
    write(3)
    drain_outboxes([RegionOutbox])
    for shard in range(3):
        assert [kind for key, kind in order if key == shard] == ["sync", "async"]
    assert len(calls.calls) == 3


def test_an_async_call_past_the_timeout_is_cancelled_and_retried(calls, settings, async_receiver):
    settings.OUTBOX_CONCURRENCY = 4
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.3
    receiver = async_receiver(AsyncCalls(seconds=30))
    write(2)
    stats = drain_outboxes([RegionOutbox])
    assert stats.failures == 2
    assert sorted(receiver.cancelled) == [0, 1]
    for row in RegionOutbox.objects.all():
        assert row.attempts == 1 and "TimeoutError" in row.last_error
    assert ShardLease.objects.backing_off().count() == 2
    # Cancelled, not stuck: no slot thread outlives the drain.
    assert not any(t.name == "outbox-slot" for t in threading.enumerate())


def test_a_synchronous_flush_delivers_to_async_receivers(calls, async_receiver):
    receiver = async_receiver(AsyncCalls())
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=5, object_identifier=5)
    assert [entry[0] for entry in receiver.entries] == [5]
    assert not RegionOutbox.objects.exists()
