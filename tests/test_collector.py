"""The drain reads its windows with the cyclic garbage collector paused, and delivers
windows of receivers that return at once with it paused too: receivers that wait, and a
drain's first window, run with it on, and a process that turned it off keeps it off."""

import gc
import threading
import time

import pytest

from outbox.engine import drain_outboxes, pipeline
from outbox.engine.pipeline import collector_paused, end_long_pause
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_restored_after_even_on_error(collector_on):
    with pytest.raises(ZeroDivisionError), collector_paused():
        assert not gc.isenabled()
        1 / 0  # noqa: B018
    assert gc.isenabled()


def test_a_process_that_turned_the_collector_off_keeps_it_off(collector_on):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_pauses_in_two_threads_end_with_the_last(collector_on):
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def second():
        first_in.wait(5)
        with collector_paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())  # the first thread left; this one still reads

    thread = threading.Thread(target=second)
    thread.start()
    with collector_paused():
        first_in.set()
        second_in.wait(5)
    first_out.set()
    thread.join(5)
    assert seen == [False]
    assert gc.isenabled()


@committing
def test_receivers_run_with_the_collector_on_and_the_drain_leaves_it_on(calls, collector_on):
    seen = []
    calls.during_call = lambda sender, kwargs: seen.append(gc.isenabled())
    for identifier in range(3):
        RegionOutboxFactory(shard_identifier=identifier, object_identifier=identifier)
    stats = drain_outboxes()
    assert stats.receiver_calls == 3
    assert seen == [True, True, True]
    assert gc.isenabled()


def _collector_during_calls(calls, settings, *, call_seconds: float, concurrency: int) -> list:
    """Whether the collector was on in each receiver call of a drain of 40 shards, one
    message each, claimed a few at a time so that they come in many windows."""
    settings.OUTBOX_BATCH_SHARDS = 4
    seen = []

    def during_call(sender, kwargs):
        seen.append(gc.isenabled())
        if call_seconds:
            time.sleep(call_seconds)

    calls.during_call = during_call
    for identifier in range(40):
        RegionOutboxFactory(shard_identifier=identifier, object_identifier=identifier)
    stats = drain_outboxes(concurrency=concurrency)
    assert stats.receiver_calls == 40
    assert gc.isenabled()
    return seen


@committing
@pytest.mark.parametrize("concurrency", [1, 4])
def test_windows_of_receivers_that_return_at_once_are_delivered_with_it_paused(
    calls, settings, collector_on, concurrency
):
    """The first window runs with the collector on (nothing is known of its receivers
    yet); once a window's calls returned at once, the next ones are delivered paused."""
    seen = _collector_during_calls(calls, settings, call_seconds=0, concurrency=concurrency)
    assert seen[0] is True
    assert seen.count(False) >= 30, seen


@committing
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_window_that_calls_nothing_keeps_the_pause_for_the_next_batch(
    calls, settings, collector_on, concurrency
):
    """Shards of exactly a window's share of rows each (100) are read once more after
    their window, to find them empty: that empty window says nothing of the receivers,
    and the next batch's windows are still delivered paused (they ran with the
    collector on, a quarter to a half of a backlog's calls, and its collections cost the
    drain a quarter of its CPU)."""
    settings.OUTBOX_BATCH_SHARDS = 4
    settings.OUTBOX_BATCH_ROWS = 400  # 100 rows a shard: all of each, then an empty read
    seen = []
    calls.during_call = lambda sender, kwargs: seen.append(gc.isenabled())
    RegionOutbox.objects.bulk_create(
        RegionOutboxFactory.build(shard_identifier=shard, object_identifier=obj)
        for shard in range(12)
        for obj in range(100)
    )
    stats = drain_outboxes(concurrency=concurrency)
    assert stats.receiver_calls == 1200
    assert seen[0] is True  # the drain's first window: nothing known of its receivers
    assert seen.count(True) <= 400, f"{seen.count(True)} of 1200 calls with the collector on"
    assert gc.isenabled()


@committing
@pytest.mark.parametrize("concurrency", [1, 4])
def test_receivers_that_wait_always_run_with_the_collector_on(
    calls, settings, collector_on, concurrency
):
    seen = _collector_during_calls(calls, settings, call_seconds=0.003, concurrency=concurrency)
    assert all(seen), seen


def test_a_pause_that_lasts_is_ended_and_the_blocks_still_in_it_go_on_unpaused(collector_on):
    with collector_paused():
        end_long_pause(time.monotonic())  # not long yet
        assert not gc.isenabled()
        end_long_pause(time.monotonic() + pipeline.LONGEST_PAUSE_SECONDS)
        assert gc.isenabled()
        with collector_paused():  # a block that starts now does not pause it again
            assert gc.isenabled()
    assert gc.isenabled()
    with collector_paused():  # the next pause, once every block has left, does
        assert not gc.isenabled()
    assert gc.isenabled()


@committing
def test_a_receiver_that_turns_slow_in_a_paused_window_gets_the_collector_back(
    calls, settings, collector_on
):
    """The windows before returned at once, so this one is delivered paused; one of its
    calls then takes 2.5 s: the lease keeper turns the collector back on meanwhile."""
    settings.OUTBOX_BATCH_SHARDS = 4
    seen = []

    def during_call(sender, kwargs):
        if kwargs["object_identifier"] == 30:
            paused_at_start = not gc.isenabled()
            time.sleep(2.5)
            seen.append((paused_at_start, gc.isenabled()))

    calls.during_call = during_call
    for identifier in range(40):
        RegionOutboxFactory(shard_identifier=identifier, object_identifier=identifier)
    assert drain_outboxes(concurrency=1).receiver_calls == 40
    assert seen == [(True, True)]
    assert gc.isenabled()
