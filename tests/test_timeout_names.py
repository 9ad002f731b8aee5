"""A receiver call given up or cancelled at OUTBOX_RECEIVER_TIMEOUT_SECONDS names the
receiver: in the error recorded on the row (`last_error`, its traceback) and in the
warning logged when a sync call is given up, an operator reads which receiver hung."""

import asyncio
import logging
import threading

import pytest

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from outbox.signals import process_region_outbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.receivers import record
from tests.workers import wait_until

pytestmark = [committing]

SYNC = "tests.testapp.receivers.record"
ASYNC = "tests.test_timeout_names.hangs"
ALSO = "tests.test_timeout_names.also"


async def hangs(sender, **kwargs):
    await asyncio.sleep(30)


@pytest.fixture
def async_hangs():
    process_region_outbox.connect(hangs, sender=Category.AUDIT_EVENT, weak=False)
    yield
    process_region_outbox.disconnect(hangs, sender=Category.AUDIT_EVENT)


@pytest.fixture
def async_only(async_hangs):
    """AUDIT_EVENT with `hangs` alone: its shards are awaited on the drain's loop."""
    process_region_outbox.disconnect(record, sender=Category.AUDIT_EVENT)
    yield
    process_region_outbox.connect(record, sender=Category.AUDIT_EVENT)


def timed_out_row():
    row = RegionOutbox.objects.get()
    assert row.attempts == 1 and "TimeoutError" in row.last_error, row.last_error
    return row


def test_a_sync_call_given_up_names_its_receiver_in_the_error_and_the_warning(
    calls, settings, caplog
):
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.5
    RegionOutboxFactory(shard_identifier=1)
    release = threading.Event()
    calls.during_call = lambda sender, kwargs: release.wait(20)
    try:
        with caplog.at_level(logging.WARNING, logger="outbox.engine"):
            assert drain_outboxes([RegionOutbox]).timed_out == 1
    finally:
        release.set()
    wait_until(lambda: not any(t.name == "outbox-slot" for t in threading.enumerate()), 20)
    row = timed_out_row()
    [error] = row.last_error.splitlines()
    assert SYNC in error, error
    assert "ran past 0.5s (OUTBOX_RECEIVER_TIMEOUT_SECONDS)" in error
    assert SYNC in row.last_traceback.splitlines()[-1]
    [warning] = [r for r in caplog.records if getattr(r, "event", "") == "outbox.receiver_timeout"]
    assert SYNC in warning.getMessage(), warning.getMessage()
    assert warning.receivers == [SYNC]


def also(sender, **kwargs):
    pass


@pytest.fixture
def second_receiver():
    process_region_outbox.connect(also, sender=Category.AUDIT_EVENT, weak=False)
    yield
    process_region_outbox.disconnect(also, sender=Category.AUDIT_EVENT)


def test_a_sync_call_given_up_names_every_receiver_it_may_be_in(
    calls, settings, caplog, second_receiver
):
    """A category with two receivers: the call given up was in one of them, which the
    drain cannot tell from outside the thread: both are named, in calling order."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.5
    RegionOutboxFactory(shard_identifier=1)
    release = threading.Event()
    calls.during_call = lambda sender, kwargs: release.wait(20)
    try:
        with caplog.at_level(logging.WARNING, logger="outbox.engine"):
            assert drain_outboxes([RegionOutbox]).timed_out == 1
    finally:
        release.set()
    wait_until(lambda: not any(t.name == "outbox-slot" for t in threading.enumerate()), 20)
    error = timed_out_row().last_error
    assert f"one of {SYNC}, {ALSO}" in error, error
    [warning] = [r for r in caplog.records if getattr(r, "event", "") == "outbox.receiver_timeout"]
    assert f"one of {SYNC}, {ALSO}" in warning.getMessage()
    assert warning.receivers == [SYNC, ALSO]


def test_an_async_call_cancelled_beside_a_sync_receiver_names_it(calls, settings, async_hangs):
    """Awaited from a slot thread (the category has a sync receiver too)."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.3
    RegionOutboxFactory(shard_identifier=1)
    assert drain_outboxes([RegionOutbox]).failures == 1
    row = timed_out_row()
    # The exception's own text names it, not only the line's prefix.
    assert f"TimeoutError: async receiver {ASYNC} cancelled after 0.3s" in row.last_error
    assert f"async receiver {ASYNC} cancelled" in row.last_traceback


def test_an_awaited_call_cancelled_on_the_loop_names_it(calls, settings, async_only):
    """Awaited by a coroutine on the drain's loop (the category's receivers are all
    `async def`)."""
    settings.OUTBOX_CONCURRENCY = 2
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.3
    RegionOutboxFactory(shard_identifier=1)
    assert drain_outboxes([RegionOutbox]).failures == 1
    row = timed_out_row()
    assert f"TimeoutError: async receiver {ASYNC} cancelled after 0.3s" in row.last_error
    assert f"async receiver {ASYNC} cancelled" in row.last_traceback
