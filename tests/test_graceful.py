"""Graceful stop: DrainWorker in-process, and `manage.py drain_outboxes --loop` as a real
process that SIGTERM stops."""

import re
import signal
import sys
import threading
import time

import pytest

from outbox.engine import DrainWorker
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.testapp.models import Delivery
from tests.workers import Process, wait_until, worker_env

pytestmark = committing


@pytest.fixture
def blocked(calls):
    """A receiver that waits until the test lets it go; the drain thread is joined at the
    end, so nothing of it outlives the test."""
    release = threading.Event()
    calls.during_call = lambda sender, kwargs: release.wait(10)
    yield release
    release.set()
    for thread in threading.enumerate():
        if thread.name == "outbox-drain":
            thread.join(10)


def test_a_stop_request_lets_the_receiver_finish_and_releases_the_rest(calls, settings):
    settings.OUTBOX_BATCH_SHARDS = 5
    for shard in range(5):
        for n in range(3):
            RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 10 + n)
    worker = DrainWorker([RegionOutbox])
    calls.delay = 0.2
    calls.during_call = lambda sender, kwargs: worker.request_stop()
    outcome = worker.run()
    assert not outcome.abandoned and outcome.stop is not None
    assert outcome.stats.receiver_calls == 1 and len(calls.calls) == 1
    assert RegionOutbox.objects.count() == 14
    assert not ShardLease.objects.exists()  # released at once, not left to expire


def test_stop_all_reaches_a_worker_running_in_another_thread(calls):
    for n in range(5):
        RegionOutboxFactory(shard_identifier=1, object_identifier=n)
    calls.delay = 0.2
    calls.during_call = lambda sender, kwargs: DrainWorker.stop_all()
    outcomes = []
    runner = threading.Thread(target=lambda: outcomes.append(DrainWorker().run()))
    runner.start()
    runner.join(10)
    assert outcomes[0].stats.receiver_calls == 1 and not outcomes[0].abandoned


def test_past_the_graceful_timeout_the_receiver_is_abandoned(blocked, settings):
    settings.OUTBOX_GRACEFUL_TIMEOUT_SECONDS = 0.2
    RegionOutboxFactory(shard_identifier=1)
    worker = DrainWorker([RegionOutbox])
    threading.Timer(0.2, worker.request_stop).start()
    started = time.monotonic()
    outcome = worker.run()
    assert outcome.abandoned and not outcome.stop.forced
    assert time.monotonic() - started < 2


def test_a_second_request_forces_and_says_how_long_after_the_first(blocked, calls):
    RegionOutboxFactory(shard_identifier=1)
    worker = DrainWorker([RegionOutbox])
    in_flight = threading.Event()

    def receiver(sender, kwargs):
        in_flight.set()
        blocked.wait(10)  # until the test ends

    calls.during_call = receiver
    marks = []  # time.monotonic() before and after each request

    def request_twice():
        in_flight.wait(10)
        for pause in (0.2, 0.4):  # into the receiver, then between the requests
            time.sleep(pause)
            marks.append(time.monotonic())
            worker.request_stop()
            marks.append(time.monotonic())

    requester = threading.Thread(target=request_twice)
    requester.start()
    outcome = worker.run()
    requester.join(10)
    assert outcome.abandoned and outcome.stop.forced
    # The time between the two requests, within what this thread saw of them.
    first_before, first_after, second_before, second_after = marks
    assert second_before - first_after <= outcome.stop.elapsed <= second_after - first_before


def test_signals_stop_the_worker_and_are_passed_on_afterwards(calls):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=1, object_identifier=2)
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        worker = DrainWorker([RegionOutbox])
        calls.delay = 0.2
        calls.during_call = lambda sender, kwargs: signal.raise_signal(signal.SIGTERM)
        with worker.handling_signals(pass_on=True):
            outcome = worker.run()
            assert received == []  # the worker took it
        assert outcome.stop.signum == signal.SIGTERM and outcome.stats.receiver_calls == 1
        assert received == [signal.SIGTERM]  # then the previous handler got it
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_errors_of_the_drain_are_raised_in_the_caller(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError

    monkeypatch.setattr("outbox.engine.worker.drain_outboxes", broken)
    with pytest.raises(ZeroDivisionError):
        DrainWorker().run()


def drain_loop(tmp_path, receiver_delay, **settings):
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop", "--settings=tests.settings"]
    return Process(args, worker_env(receiver_delay, **settings), tmp_path / "drain.log")


@server_database_only
def test_sigterm_finishes_the_receiver_in_flight_and_releases_the_rest(tmp_path):
    for shard in range(6):
        for n in range(5):
            RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 10 + n)
    drainer = drain_loop(tmp_path, receiver_delay=0.3, OUTBOX_BATCH_SHARDS=6)
    try:
        wait_until(lambda: Delivery.objects.exists(), timeout=20)
        exit_seconds = drainer.terminate()
    finally:
        drainer.stop()
    output = drainer.output()
    assert drainer.popen.returncode == 0, output
    assert "stopping after the current receiver" in output
    assert exit_seconds < 3, output
    # Everything it called was delivered and deleted; nothing else was touched.
    delivered = set(Delivery.objects.values_list("object_identifier", flat=True))
    remaining = set(RegionOutbox.objects.values_list("object_identifier", flat=True))
    assert delivered and remaining
    assert not delivered & remaining
    assert len(delivered | remaining) == 30
    assert not ShardLease.objects.exists()  # released at once, not left to expire


@server_database_only
def test_sigterm_stops_past_the_graceful_timeout(tmp_path):
    RegionOutboxFactory(shard_identifier=1)
    drainer = drain_loop(tmp_path, receiver_delay=30.0, OUTBOX_GRACEFUL_TIMEOUT_SECONDS=0.5)
    try:
        wait_until(lambda: ShardLease.objects.exists(), timeout=20)
        time.sleep(1.0)  # inside the 30-second receiver
        exit_seconds = drainer.terminate()
    finally:
        drainer.stop()
    assert drainer.popen.returncode == 4, drainer.output()
    assert exit_seconds < 3
    assert "graceful timeout" in drainer.output()
    # The receiver never finished: the row stays, its lease expires by itself.
    assert RegionOutbox.objects.count() == 1
    assert ShardLease.objects.get().token is not None


@server_database_only
def test_a_second_sigterm_stops_at_once(tmp_path):
    RegionOutboxFactory(shard_identifier=1)
    drainer = drain_loop(tmp_path, receiver_delay=30.0)
    try:
        wait_until(lambda: ShardLease.objects.exists(), timeout=20)
        time.sleep(1.0)  # inside the 30-second receiver
        first_sent = time.monotonic()
        drainer.popen.send_signal(signal.SIGTERM)
        drainer.wait_for_output("stopping after the current receiver")
        first_taken = time.monotonic()
        time.sleep(0.5)
        second_sent = time.monotonic()
        exit_seconds = drainer.terminate()
        exited = time.monotonic()
    finally:
        drainer.stop()
    output = drainer.output()
    assert drainer.popen.returncode == 4, output
    assert exit_seconds < 3, output
    # Both messages say how long after the first signal the second came: within what
    # this process saw of the two (each printed to a tenth of a second).
    [again] = re.findall(r"signal 15 again after (\d+\.\d)s, stopping now", output)
    [after] = re.findall(r"at a second stop request (\d+\.\d)s after the first", output)
    assert again == after, output
    assert second_sent - first_taken - 0.05 <= float(again) <= exited - first_sent + 0.05
