"""Receivers that wait: a drain delivers its claimed shards on several slot threads at
once, one call at a time per shard, and a slow or hung call holds only its own shard."""

import io
import itertools
import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import OperationalError, connection, connections
from django.db.backends.signals import connection_created

from outbox.engine import DrainWorker, drain_outboxes
from outbox.engine.drain import Drainer
from outbox.engine.slots import stuck_receivers
from outbox.exceptions import StuckReceivers
from outbox.management.commands.drain_outboxes import Command as DrainCommand
from outbox.models import RegionOutbox, ShardLease
from outbox.signals import message_processed, receivers_stuck
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory

pytestmark = [committing]


class Timeline:
    """Each receiver call's shard, object, thread and start/end, written from any thread."""

    def __init__(self, calls, wait=lambda kwargs: 0.0):
        self.entries = []
        self.lock = threading.Lock()
        self.wait = wait
        calls.during_call = self

    def __call__(self, sender, kwargs):
        started = time.monotonic()
        delay = self.wait(kwargs)
        if delay:
            time.sleep(delay)
        with self.lock:
            self.entries.append(
                (
                    kwargs["shard_identifier"],
                    kwargs["object_identifier"],
                    (threading.current_thread().name, threading.get_ident()),
                    started,
                    time.monotonic(),
                )
            )

    def by_shard(self):
        shards = defaultdict(list)
        for entry in sorted(self.entries, key=lambda e: e[3]):
            shards[entry[0]].append(entry)
        return shards

    def most_at_once(self):
        edges = sorted([(e[3], 1) for e in self.entries] + [(e[4], -1) for e in self.entries])
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        return peak


def wait_until(condition, every=0.05, tries=100):
    """Poll `condition` until it holds or the tries run out (the caller asserts)."""
    for _ in range(tries):
        if condition():
            return
        time.sleep(every)


def write(shards, per_shard=1):
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=shard * 1000 + n)
            for shard in range(shards)
            for n in range(per_shard)
        ]
    )


def assert_in_order_one_at_a_time(timeline):
    for shard, entries in timeline.by_shard().items():
        for previous, current in itertools.pairwise(entries):
            assert current[3] >= previous[4], f"two calls of shard {shard} overlapped"
        objects = [entry[1] for entry in entries]
        assert objects == sorted(objects), f"shard {shard} delivered out of order"


def test_slots_deliver_several_shards_at_once_each_in_order(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    write(8, per_shard=3)
    timeline = Timeline(calls, wait=lambda kwargs: 0.05)
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 24 and stats.receiver_calls == 24
    assert_in_order_one_at_a_time(timeline)
    assert timeline.most_at_once() >= 2  # calls of different shards really overlapped
    assert len({entry[2] for entry in timeline.entries}) >= 2
    assert all(entry[2][0] == "outbox-slot" for entry in timeline.entries)
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_concurrency_1_delivers_on_the_drains_own_thread(calls, settings):
    settings.OUTBOX_CONCURRENCY = 1
    write(4, per_shard=2)
    timeline = Timeline(calls, wait=lambda kwargs: 0.01)
    drain_outboxes([RegionOutbox])
    assert timeline.most_at_once() == 1
    assert {entry[2][0] for entry in timeline.entries} == {threading.current_thread().name}


def test_receivers_that_return_at_once_stay_on_one_slot(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    write(50)
    timeline = Timeline(calls)
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 50
    assert len({entry[2] for entry in timeline.entries}) == 1


def test_drainer_concurrency_argument_overrides_the_setting(calls, settings):
    settings.OUTBOX_CONCURRENCY = 1
    write(6)
    timeline = Timeline(calls, wait=lambda kwargs: 0.05)
    Drainer(RegionOutbox, concurrency=3).drain()
    assert timeline.most_at_once() >= 2


@pytest.mark.parametrize("shards", [1, 6])
def test_a_slow_receiver_holds_only_its_own_shard(calls, settings, shards):
    """While one call runs long, the drain settles the other shards and delivers a
    shard written meanwhile (also when the slow shard was claimed alone)."""
    settings.OUTBOX_CONCURRENCY = 4
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.2
    write(shards)
    late_delivered = threading.Event()
    seen_while_slow = {}

    def wait(kwargs):
        if kwargs["object_identifier"] == 99_000:
            late_delivered.set()
        elif kwargs["shard_identifier"] == 0:
            time.sleep(0.6)  # long enough to be carved out of its window
            RegionOutboxFactory(shard_identifier=99, object_identifier=99_000)
            late_delivered.wait(10)
            wait_until(
                lambda: not RegionOutbox.objects.filter(shard_identifier=99).exists(), every=0.05
            )  # until the late shard's settle has run
            seen_while_slow["rows"] = sorted(
                RegionOutbox.objects.values_list("shard_identifier", flat=True)
            )
        return 0.0

    Timeline(calls, wait=wait)
    stats = drain_outboxes([RegionOutbox])
    assert late_delivered.is_set(), "the shard written meanwhile waited for the slow call"
    assert seen_while_slow["rows"] == [0]  # the rest were settled while it ran
    assert stats.rows_retired == shards + 1
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_a_hung_call_times_out_as_a_failed_attempt_and_is_counted_stuck(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 1.0
    write(5)
    release = threading.Event()

    def wait(kwargs):
        if kwargs["shard_identifier"] == 2:
            release.wait(20)
        return 0.0

    Timeline(calls, wait=wait)
    stuck_counts = []

    def on_stuck(sender, count, **kwargs):
        stuck_counts.append((sender, count))

    receivers_stuck.connect(on_stuck)
    try:
        try:
            stats = Drainer(RegionOutbox).drain()
            assert stuck_counts == [(RegionOutbox, 1)]  # counted while its call runs on
            assert stuck_receivers() == 1
            command = DrainCommand(stdout=io.StringIO())
            command.verbosity, command.using = 2, "default"
            command._heartbeat(stats, 1.0)
            assert "1 receiver thread(s) stuck" in command.stdout.getvalue()
        finally:
            release.set()
        # Its thread ends once its call returns, and is no longer counted.
        wait_until(lambda: not any(t.name == "outbox-slot" for t in threading.enumerate()))
        assert not any(t.name == "outbox-slot" for t in threading.enumerate())
        assert stuck_counts == [(RegionOutbox, 1), (RegionOutbox, 0)]
        assert stuck_receivers() == 0
    finally:
        receivers_stuck.disconnect(on_stuck)
    assert stats.failures == 1 and stats.rows_retired == 4 and stats.timed_out == 1
    assert "receiver calls timed out 1" in stats.summary()
    hung = RegionOutbox.objects.get()
    assert hung.shard_identifier == 2 and hung.attempts == 1
    assert "TimeoutError" in hung.last_error
    # The shard backs off like any failure; its late result was thrown away: the row
    # stays for its retry.
    assert ShardLease.objects.backing_off().count() == 1
    assert RegionOutbox.objects.filter(pk=hung.pk).exists()


def test_too_many_stuck_calls_stop_the_drain(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.5
    settings.OUTBOX_MAX_STUCK_RECEIVERS = 1
    write(4)
    release = threading.Event()
    Timeline(calls, wait=lambda kwargs: release.wait(20) and 0.0)
    try:
        with pytest.raises(StuckReceivers):
            drain_outboxes([RegionOutbox])
    finally:
        release.set()
    assert RegionOutbox.objects.count() == 4  # every row kept for its retry


def test_a_stop_settles_finished_calls_and_releases_unstarted_shards(calls, settings):
    settings.OUTBOX_CONCURRENCY = 2
    write(10)
    stop = threading.Event()
    finish_slow = threading.Event()

    seen_during_call = {}

    def wait(kwargs):
        if kwargs["shard_identifier"] == 3:
            stop.set()  # a stop arrives while shard 3's call runs
            wait_until(
                lambda: list(ShardLease.objects.values_list("shard_identifier", flat=True)) == [3],
                every=0.05,
            )  # the rest is settled and released while it still runs
            seen_during_call["leased"] = list(
                ShardLease.objects.values_list("shard_identifier", flat=True)
            )
            seen_during_call["rows"] = RegionOutbox.objects.count()
            finish_slow.set()
        return 0.0

    timeline = Timeline(calls, wait=wait)
    drainer = Drainer(RegionOutbox, stop=stop)
    stats = drainer.drain()
    delivered = {entry[0] for entry in timeline.entries}
    assert {0, 1, 2, 3} <= delivered and len(delivered) < 10
    assert seen_during_call["leased"] == [3]  # only the shard still in a call
    # Every call finished before it was settled while shard 3's call still ran.
    assert seen_during_call["rows"] == 10 - (len(delivered) - 1)
    assert stats.rows_retired == len(delivered)
    assert sorted(RegionOutbox.objects.values_list("shard_identifier", flat=True)) == [
        shard for shard in range(10) if shard not in delivered
    ]
    assert not ShardLease.objects.exists()  # none left leased


def test_slot_threads_and_their_connections_end_with_the_drain(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    write(8)
    Timeline(calls, wait=lambda kwargs: 0.02)
    calls.journal = True  # each call writes through its slot's own connection
    before = server_connections()
    drain_outboxes([RegionOutbox])
    assert not any(t.name == "outbox-slot" for t in threading.enumerate())
    wait_until(
        lambda: server_connections() == before, every=0.05
    )  # the server notices a closed connection a moment later
    assert server_connections() == before


def server_connections():
    """Connections to this test database, where the server can tell (else None)."""
    if connection.vendor == "postgresql":
        sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    elif connection.vendor == "mysql":
        sql = "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
    else:
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="terminates a PostgreSQL backend")
def test_a_drain_that_fails_lets_its_stragglers_leases_expire(calls, settings):
    """The drain's own connection dies while a carved-out shard still runs: the drain
    raises, and the straggler's lease is no longer renewed, so the shard is retried."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_LEASE_SECONDS = 1.0
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.2
    write(2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        drain_pid = cursor.fetchone()[0]
    slow_once = threading.Event()

    def wait(kwargs):
        if kwargs["shard_identifier"] == 0 and not slow_once.is_set():
            slow_once.set()
            time.sleep(0.8)  # carved out of its window by now
            with connection.cursor() as cursor:  # this slot's own connection
                cursor.execute("SELECT pg_terminate_backend(%s)", [drain_pid])
            time.sleep(0.5)
            raise RuntimeError("this call fails, so shard 0 is delivered again")
        return 0.0

    Timeline(calls, wait=wait)
    with pytest.raises(OperationalError):
        drain_outboxes([RegionOutbox])
    connection.close()
    time.sleep(1.5)  # past the lease: nobody renews it any more
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 1
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_a_window_that_reads_nothing_ends(calls, settings):
    """Shards holding exactly their share of a window are read once more, empty, to learn
    that they are done (ordered streams: many rows per shard); on slots that empty window
    must end too."""
    settings.OUTBOX_CONCURRENCY = 4
    write(100, per_shard=100)
    result = {}

    def drain_in_thread():
        try:
            result["stats"] = drain_outboxes([RegionOutbox])
        finally:
            connections.close_all()

    drain = threading.Thread(target=drain_in_thread, daemon=True)
    drain.start()
    drain.join(20)
    assert not drain.is_alive(), "the drain waited for an empty window"
    assert result["stats"].rows_retired == 10_000


def test_a_loop_keeps_its_slots_and_their_connections_across_rounds(calls, settings):
    """`drain_outboxes --loop` delivers round after round on the same slot threads: a
    receiver that uses the database does not open a connection every round."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    calls.journal = True  # each call writes through its slot's connection
    opened = []  # the slot thread of each connection opened

    def note(sender, connection, **kwargs):
        if threading.current_thread().name == "outbox-slot":
            opened.append(threading.get_ident())

    connection_created.connect(note)
    worker = DrainWorker([RegionOutbox], loop=True)
    runner = threading.Thread(target=worker.run)
    try:
        runner.start()
        for n in range(6):  # one row at a time: a round each
            RegionOutboxFactory(shard_identifier=n, object_identifier=n)
            wait_until(lambda: not RegionOutbox.objects.exists(), every=0.02)
    finally:
        worker.request_stop()
        runner.join(30)
        connection_created.disconnect(note)
    assert calls.calls and len(calls.calls) == 6
    # The same (at most two) threads all along, each opening its connection once, not
    # once a round; Django 6's MySQL backend also opens a temporary one, once per
    # thread, to read the server's version.
    per_thread = Counter(opened)
    assert len(per_thread) <= 2 and max(per_thread.values()) <= 2, per_thread


@server_database_only
def test_one_shot_drains_started_together_both_find_work(calls, settings):
    """Two one-shot drains started at the same moment walk the same shards; the one
    whose claim loses them all looks once more instead of ending with nothing."""
    settings.OUTBOX_CONCURRENCY = 1
    write(64)
    Timeline(calls, wait=lambda kwargs: 0.01)
    start = threading.Barrier(2)
    results = []

    def drain():
        try:
            start.wait(10)
            results.append(drain_outboxes([RegionOutbox]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drain) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(stats.receiver_calls > 0 for stats in results) == [True, True]
    assert sum(stats.rows_retired for stats in results) == 64


def test_only_a_call_given_up_at_the_timeout_overlaps_a_later_delivery(calls, settings):
    """The documented overlap: a sync call past the timeout no longer holds its shard, so
    once the back-off has passed another drain delivers the message again while the old
    call still runs."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.5
    settings.OUTBOX_BACKOFF_BASE_SECONDS = 0.2
    settings.OUTBOX_BACKOFF_MAX_SECONDS = 0.2
    write(1)
    first_call = threading.Event()
    release = threading.Event()

    def wait(kwargs):
        if not first_call.is_set():
            first_call.set()
            release.wait(20)
        return 0.0

    timeline = Timeline(calls, wait=wait)
    try:
        assert drain_outboxes([RegionOutbox]).timed_out == 1
        wait_until(lambda: drain_outboxes([RegionOutbox]).rows_retired)
        assert not RegionOutbox.objects.exists()  # delivered again, and settled
        assert len(timeline.entries) == 1  # only the second call has returned so far
    finally:
        release.set()
    wait_until(lambda: len(timeline.entries) == 2)
    first, second = sorted(timeline.entries, key=lambda entry: entry[3])
    assert second[3] < first[4]  # the two calls of the shard overlapped


@server_database_only
def test_without_a_timeout_a_hung_call_on_a_slot_loses_its_lease_at_the_deadline(calls, settings):
    """With the timeout off, OUTBOX_RECEIVER_DEADLINE_SECONDS still bounds a call on a
    slot: its lease is no longer renewed, expires, and the shard is claimed again (here
    by the same drain, which goes on claiming while the call hangs)."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0
    settings.OUTBOX_LEASE_SECONDS = 1.0
    settings.OUTBOX_RECEIVER_DEADLINE_SECONDS = 0.6
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.2
    write(1)
    first_call = threading.Event()
    release = threading.Event()

    def wait(kwargs):
        if not first_call.is_set():
            first_call.set()
            release.wait(20)
        else:
            release.set()  # delivered again while the first call hangs
        return 0.0

    timeline = Timeline(calls, wait=wait)
    before_claim = time.monotonic()
    drain_outboxes([RegionOutbox])
    first, second = sorted(timeline.entries, key=lambda entry: entry[3])
    # Once the lease (1 s from the claim, which came after `before_claim`) had expired:
    # the call's deadline stopped its renewal.
    assert second[3] >= before_claim + 1.0
    assert second[3] < first[3] + 5.0
    assert second[3] < first[4]  # while the first call still ran
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_an_error_outside_the_receivers_ends_the_window_and_reaches_the_drain(calls, settings):
    """An error the engine does not turn into a failed attempt (here a lifecycle
    listener raising) is raised by the drain, as on its own thread; it never hangs."""
    settings.OUTBOX_CONCURRENCY = 2
    write(5)
    seen = []

    def listener(sender, **kwargs):
        seen.append(sender)
        if len(seen) == 2:
            raise RuntimeError("a listener broke")

    message_processed.connect(listener, weak=False)
    result = {}

    def drain():
        try:
            drain_outboxes([RegionOutbox])
        except RuntimeError as exc:
            result["error"] = exc
        finally:
            connections.close_all()

    try:
        runner = threading.Thread(target=drain, daemon=True)
        runner.start()
        runner.join(20)
    finally:
        message_processed.disconnect(listener)
    assert not runner.is_alive(), "the drain hung on the failed window"
    assert str(result["error"]) == "a listener broke"
    assert not ShardLease.objects.exists()  # every shard of the window released
