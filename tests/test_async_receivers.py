"""`async def` receivers: awaited on the drain's own event loop, concurrently across
shards; cancelled at the receiver timeout; still delivered by a synchronous flush."""

import asyncio
import itertools
import threading
import time

import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from outbox.signals import message_processed, process_region_outbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.receivers import record

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


@pytest.fixture
def async_only():
    """AUDIT_EVENT without the test app's sync recorder: its receivers are the test's
    `async def` ones only, so a drain awaits its shards on the loop, no slot each."""
    process_region_outbox.disconnect(record, sender=Category.AUDIT_EVENT)
    yield
    process_region_outbox.connect(record, sender=Category.AUDIT_EVENT)


def slot_threads():
    return sum(thread.name == "outbox-slot" for thread in threading.enumerate())


def test_shards_of_async_receivers_only_are_awaited_without_a_slot_each(
    calls, settings, async_receiver, async_only
):
    settings.OUTBOX_CONCURRENCY = 40
    seen_slots = []

    async def receive(sender, shard_identifier, **kwargs):
        seen_slots.append(slot_threads())
        await asyncio.sleep(0.3)

    receiver = async_receiver(AsyncCalls(seconds=0.3))
    async_receiver(receive)
    write(40)
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 40 and stats.receiver_calls == 40
    assert {entry[1] for entry in receiver.entries} == {"outbox-event-loop"}
    first_end = min(entry[4] for entry in receiver.entries)
    assert sum(entry[3] < first_end for entry in receiver.entries) >= 30  # awaited at once
    assert max(seen_slots) <= 2  # not a slot thread per call in flight
    assert not calls.calls  # the sync recorder was not called


def test_awaited_shards_keep_their_order_and_stop_at_a_failure(
    calls, settings, async_receiver, async_only
):
    settings.OUTBOX_CONCURRENCY = 8
    entries = []

    async def receive(sender, shard_identifier, object_identifier, **kwargs):
        started = time.monotonic()
        await asyncio.sleep(0.01)
        if object_identifier == 1001:
            raise RuntimeError("shard 1 refuses its second message")
        entries.append((shard_identifier, object_identifier, started, time.monotonic()))

    async_receiver(receive)
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=shard * 1000 + n)
            for n in range(4)
            for shard in range(5)
        ]
    )
    stats = drain_outboxes([RegionOutbox])
    assert stats.failures == 1 and stats.rows_retired == 17
    for shard in range(5):
        mine = sorted((e for e in entries if e[0] == shard), key=lambda e: e[2])
        assert [e[1] for e in mine] == sorted(e[1] for e in mine)  # in order
        assert all(b[2] >= a[3] for a, b in itertools.pairwise(mine))  # one at a time
    left = sorted(RegionOutbox.objects.values_list("object_identifier", flat=True))
    assert left == [1001, 1002, 1003]  # shard 1 stopped at its failure, in order


def test_an_awaited_call_past_the_timeout_is_cancelled_and_retried(
    calls, settings, async_receiver, async_only
):
    settings.OUTBOX_CONCURRENCY = 4
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.3
    receiver = async_receiver(AsyncCalls(seconds=30))
    write(2)
    stats = drain_outboxes([RegionOutbox])
    assert stats.failures == 2 and stats.timed_out == 0  # cancelled: no thread stuck
    assert sorted(receiver.cancelled) == [0, 1]
    for row in RegionOutbox.objects.all():
        assert row.attempts == 1 and "TimeoutError" in row.last_error
    assert ShardLease.objects.backing_off().count() == 2


def test_awaited_shards_carved_out_of_their_window_start_no_slot_threads(
    calls, settings, async_receiver, async_only
):
    """Calls long enough to outlast their window (stragglers) do not make the next
    window start on every slot."""
    settings.OUTBOX_CONCURRENCY = 20
    settings.OUTBOX_BATCH_SHARDS = 5
    seen_slots = []

    async def receive(sender, shard_identifier, **kwargs):
        seen_slots.append(slot_threads())
        await asyncio.sleep(0.8)

    async_receiver(receive)
    write(15)
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 15 and len(seen_slots) == 15
    assert max(seen_slots) <= 2


def test_lifecycle_receivers_of_awaited_shards_may_query_the_database(
    calls, settings, async_receiver, async_only
):
    """Django refuses ORM queries in a thread running an event loop: the lifecycle
    signals of shards awaited on the loop are sent from a thread beside it."""
    settings.OUTBOX_CONCURRENCY = 4
    seen = []

    def processed(sender, shard, **kwargs):
        seen.append((shard.shard_identifier, RegionOutbox.objects.count() >= 0))

    async_receiver(AsyncCalls(seconds=0.01))
    message_processed.connect(processed, sender=RegionOutbox, weak=False)
    try:
        write(3)
        stats = drain_outboxes([RegionOutbox])
    finally:
        message_processed.disconnect(processed, sender=RegionOutbox)
    assert stats.rows_retired == 3
    assert sorted(seen) == [(0, True), (1, True), (2, True)]


def test_awaited_calls_in_flight_reach_the_concurrency_past_the_batch_shards(
    calls, settings, async_receiver, async_only
):
    """Calls awaited on the loop go on while the drain claims and reads more shards: with
    `async def` receivers that wait, OUTBOX_CONCURRENCY calls are in flight, far above
    OUTBOX_BATCH_SHARDS (what one claim takes)."""
    settings.OUTBOX_CONCURRENCY = 200
    settings.OUTBOX_BATCH_SHARDS = 20
    receiver = async_receiver(AsyncCalls(seconds=0.5))
    write(400)
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 400
    edges = sorted([(e[3], 1) for e in receiver.entries] + [(e[4], -1) for e in receiver.entries])
    peak = max(itertools.accumulate(step for _, step in edges))
    assert peak >= 150, peak  # of 200: every slot busy, short of the claims' own time
