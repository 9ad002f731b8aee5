"""Shard exclusivity with real threads on a server database."""

import itertools
import threading
import time
from collections import defaultdict

import pytest
from django.db import connections, transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.testapp.models import Delivery

pytestmark = [committing, server_database_only, pytest.mark.concurrency]


def run_threads(*targets):
    errors = []

    def wrapped(target):
        try:
            target()
        except BaseException as exc:  # surfaced in the test below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrapped, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)


def drain_until_empty():
    for _ in range(500):
        drain_outboxes([RegionOutbox])
        if not RegionOutbox.objects.exists():
            return
    raise AssertionError("backlog did not drain")


def assert_no_overlap_and_in_order():
    by_shard = defaultdict(list)
    for delivery in Delivery.objects.order_by("started"):
        by_shard[delivery.shard_identifier].append(delivery)
    for shard, deliveries in by_shard.items():
        for previous, current in itertools.pairwise(deliveries):
            assert current.started >= previous.ended, f"receivers of shard {shard} overlapped"
        objects = [d.object_identifier for d in deliveries]
        assert objects == sorted(objects), f"shard {shard} delivered out of order"
    return by_shard


def test_two_drainers_never_run_one_shard_at_once(calls, settings):
    settings.OUTBOX_BATCH_SHARDS = 3
    calls.journal = True
    calls.delay = 0.002
    for shard in range(12):
        for n in range(8):
            RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 100 + n)
    run_threads(drain_until_empty, drain_until_empty)
    by_shard = assert_no_overlap_and_in_order()
    assert sum(len(d) for d in by_shard.values()) == 96  # each row exactly once
    assert len({d.thread for d in Delivery.objects.all()}) == 2  # both really worked
    assert not ShardLease.objects.exists()


def test_synchronous_flushes_and_a_drain_deliver_each_row_once(calls):
    calls.journal = True
    writing = threading.Event()
    writing.set()

    def write():
        try:
            for n in range(120):
                with outbox_context(transaction.atomic()):
                    RegionOutboxFactory(shard_identifier=n % 4, object_identifier=n)
        finally:
            writing.clear()

    def drain():
        while writing.is_set():
            drain_outboxes([RegionOutbox])
        drain_until_empty()

    run_threads(write, drain)
    by_shard = assert_no_overlap_and_in_order()
    delivered = sorted(d.object_identifier for ds in by_shard.values() for d in ds)
    assert delivered == list(range(120))


def test_slow_receiver_keeps_its_lease_alive(calls, settings):
    settings.OUTBOX_LEASE_SECONDS = 1.5
    RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "slow"})
    started = threading.Event()
    other_worker = {}

    def slow_first_call(sender, kwargs):
        if kwargs["payload"] == {"v": "slow"}:
            started.set()
            time.sleep(3.0)  # two lease lengths

    def other():
        started.wait(10)
        time.sleep(2.0)  # past the original expiry
        other_worker["stats"] = drain_outboxes([RegionOutbox])

    calls.during_call = slow_first_call
    run_threads(lambda: drain_outboxes([RegionOutbox]), other)
    assert other_worker["stats"].shards == 0
    assert calls.payloads() == [{"v": "slow"}]
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_hung_receiver_loses_its_shard_after_the_deadline(calls, settings):
    settings.OUTBOX_LEASE_SECONDS = 1.0
    settings.OUTBOX_RECEIVER_DEADLINE_SECONDS = 0.2
    RegionOutboxFactory(shard_identifier=1, payload={"v": "hangs"})
    started = threading.Event()
    taken_over = {}

    def hang_once(sender, kwargs):
        if not started.is_set():
            started.set()
            time.sleep(2.5)

    def other():
        started.wait(10)
        time.sleep(1.5)  # the lease, no longer renewed, has expired
        taken_over["stats"] = drain_outboxes([RegionOutbox])

    calls.during_call = hang_once
    run_threads(lambda: drain_outboxes([RegionOutbox]), other)
    assert taken_over["stats"].shards == 1
    assert taken_over["stats"].receiver_calls == 1


def test_after_a_hung_receiver_its_batch_is_not_delivered_without_the_lease(calls, settings):
    # Found by the stress runner: when the hung receiver returned, the rest of its batch
    # (read before the hang) went to the receivers although another worker had taken
    # the shards over, delivered and deleted those rows meanwhile.
    settings.OUTBOX_LEASE_SECONDS = 1.0
    settings.OUTBOX_RECEIVER_DEADLINE_SECONDS = 0.2
    RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "hangs"})
    RegionOutboxFactory(shard_identifier=2, object_identifier=2, payload={"v": "next"})
    started = threading.Event()
    taken_over = {}

    def hang_once(sender, kwargs):
        if kwargs["payload"] == {"v": "hangs"} and not started.is_set():
            started.set()
            time.sleep(2.5)

    def other():
        started.wait(10)
        time.sleep(1.5)  # the batch's lease, no longer renewed, has expired
        taken_over["stats"] = drain_outboxes([RegionOutbox])

    calls.during_call = hang_once
    run_threads(lambda: drain_outboxes([RegionOutbox]), other)
    assert taken_over["stats"].shards == 2
    assert calls.payloads().count({"v": "next"}) == 1
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_new_writes_wake_backing_off_shards_once_each_in_order(calls):
    """Shards back off after a failure; the receiver is fixed; two writers flush new
    messages to them while two drainers run. The back-offs (30 s and more in the test
    settings) never have to end: each write wakes its shard, every message is delivered
    once, in order, with no two deliveries of a shard at once."""
    calls.journal = True
    calls.failing = set(range(8))
    for shard in range(8):
        with outbox_context(transaction.atomic()):
            RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 1000)
    assert ShardLease.objects.backing_off().count() == 8
    calls.failing = set()
    writing = threading.Barrier(2)
    finished = []

    def writer(shards):
        def write():
            writing.wait()
            for n in range(1, 9):
                for shard in shards:
                    with outbox_context(transaction.atomic()):
                        RegionOutboxFactory(
                            shard_identifier=shard, object_identifier=shard * 1000 + n
                        )
            finished.append(shards)

        return write

    def drain():
        while len(finished) < 2:
            drain_outboxes([RegionOutbox])
        drain_until_empty()

    run_threads(writer(range(4)), writer(range(4, 8)), drain, drain)
    by_shard = assert_no_overlap_and_in_order()
    delivered = sorted(d.object_identifier for ds in by_shard.values() for d in ds)
    assert delivered == sorted(shard * 1000 + n for shard in range(8) for n in range(9))
    assert not ShardLease.objects.exists()
