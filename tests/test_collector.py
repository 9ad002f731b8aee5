"""The drain reads its windows with the cyclic garbage collector paused, and only then:
receivers run with it on, and a process that turned it off keeps it off."""

import gc
import threading

import pytest

from outbox.engine import drain_outboxes
from outbox.engine.drain import collector_paused
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
