"""Issue #35 (item 10): a new message makes a backing-off shard due for one early attempt.

A receiver fails and its shard backs off; the receiver is fixed; a new change of the same
object is saved. Before, nothing was delivered until the old back-off ended (up to
OUTBOX_BACKOFF_MAX_SECONDS). Now the new message wakes the shard: the flush after the
commit, or the next drain, tries it once, coalesced to the newest state. The attempt
count goes on, and a receiver still broken puts the shard back on its back-off: it is
tried once per new write, however many writes came meanwhile. Real drains, flushes and
leases on every database leg."""

import time

import pytest
from django.db import transaction

import outbox.engine.drain as drain_module
from outbox import RetryLater, outbox_context
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category

pytestmark = committing

SHARD = 7


@pytest.fixture
def attempts(calls):
    """Every receiver call on SHARD, failed or not, in order (the payloads' `n`)."""
    seen = []
    calls.during_call = lambda sender, kwargs: (
        seen.append(kwargs["payload"]["n"]) if kwargs["shard_identifier"] == SHARD else None
    )
    return seen


def change(n, *, flush, object_identifier=1, shard=SHARD):
    """A committed change of an organization: one outbox row, flushed or left to drains."""
    with outbox_context(transaction.atomic(), flush=flush):
        RegionOutboxFactory(
            shard_identifier=shard,
            category=Category.AUDIT_EVENT,
            object_identifier=object_identifier,
            payload={"n": n},
        )
    time.sleep(0.01)  # the next write is later on any database clock (SQLite: ms)


def failed_once(calls, attempts):
    """The receiver fails on the flushed first change; the shard backs off."""
    calls.failing = {SHARD}
    change(1, flush=True)
    assert attempts == [1]
    assert ShardLease.objects.backing_off().count() == 1
    [row] = RegionOutbox.objects.all()
    assert row.attempts == 1


def test_a_flushed_change_after_a_fix_is_delivered_at_once(calls, attempts):
    failed_once(calls, attempts)
    calls.failing = set()  # the fix is deployed
    change(2, flush=True)
    assert calls.payloads() == [{"n": 2}]  # coalesced: the newest state of object 1
    assert RegionOutbox.objects.count() == 0
    assert ShardLease.objects.count() == 0


def test_a_drain_delivers_a_change_written_for_it_after_a_fix(calls, attempts):
    failed_once(calls, attempts)
    calls.failing = set()
    change(2, flush=False)
    assert attempts == [1]  # nothing tried yet: no flush
    stats = drain_outboxes([RegionOutbox])
    assert stats.failures == 0
    assert calls.payloads() == [{"n": 2}]
    assert RegionOutbox.objects.count() == 0


def test_a_still_broken_receiver_is_tried_once_per_new_write(calls, attempts):
    failed_once(calls, attempts)
    change(2, flush=False)
    change(3, flush=False)
    assert drain_outboxes([RegionOutbox]).failures == 1  # one attempt for both writes
    assert attempts == [1, 3]
    assert drain_outboxes([RegionOutbox]).failures == 0  # no new write: it backs off
    assert attempts == [1, 3]
    assert ShardLease.objects.backing_off().count() == 1
    # Each row counts the attempts it was in: the first one's count goes on.
    assert sorted(RegionOutbox.objects.values_list("attempts", flat=True)) == [1, 1, 2]
    change(4, flush=True)  # the flush tries it once more, and it fails again
    assert attempts == [1, 3, 4]
    assert ShardLease.objects.backing_off().count() == 1
    calls.failing = set()
    change(5, flush=True)
    assert calls.payloads() == [{"n": 5}]
    assert RegionOutbox.objects.count() == 0


def test_rows_already_waiting_behind_the_failure_do_not_wake_it(calls, attempts):
    calls.failing = {SHARD}
    with outbox_context(transaction.atomic(), flush=True):
        RegionOutboxFactory(shard_identifier=SHARD, object_identifier=1, payload={"n": 1})
        RegionOutboxFactory(shard_identifier=SHARD, object_identifier=2, payload={"n": 2})
    assert attempts == [1]  # the shard stops at its failing group; object 2 waits
    assert drain_outboxes([RegionOutbox]).failures == 0
    assert attempts == [1]
    assert ShardLease.objects.backing_off().count() == 1


def test_a_write_to_another_shard_leaves_the_back_off_alone(calls, attempts):
    failed_once(calls, attempts)
    calls.failing = set()
    change(2, flush=True, shard=SHARD + 1)
    assert drain_outboxes([RegionOutbox]).shards == 0
    assert attempts == [1]
    assert ShardLease.objects.backing_off().count() == 1
    assert calls.payloads() == [{"n": 2}]


def test_a_scheduled_message_does_not_wake_the_shard(calls, attempts):
    """A message written for later is not due, so it asks for no early attempt."""
    failed_once(calls, attempts)
    calls.failing = set()
    change(2, flush=False, object_identifier=2)
    back_off_end = RegionOutbox.objects.get(object_identifier=1).scheduled_for
    RegionOutbox.objects.filter(object_identifier=2).update(scheduled_for=back_off_end)
    assert drain_outboxes([RegionOutbox]).shards == 0
    assert attempts == [1]


def test_a_delay_the_receiver_asked_for_is_kept(calls, attempts):
    """RetryLater (a rate limit's Retry-After) says when to try again: a new message
    does not end that wait."""
    asked = []

    def ask_later(sender, kwargs):
        attempts.append(kwargs["payload"]["n"])
        if not asked:
            asked.append(True)
            raise RetryLater(600, "rate limited")

    calls.during_call = ask_later
    change(1, flush=True)
    assert ShardLease.objects.backing_off().count() == 1
    change(2, flush=True)
    assert drain_outboxes([RegionOutbox]).shards == 0
    assert attempts == [1]
    assert calls.payloads() == []


def test_a_loop_looks_at_backing_off_shards_at_most_every_loop_wake_seconds(
    calls, attempts, monkeypatch
):
    """A loop's drains (`wait_for_others=False`, as `drain_outboxes --loop` runs them)
    look for woken shards at most every `LOOP_WAKE_SECONDS`, not on every round (a
    query a round while writes trickle in); the early attempt still comes, that much
    later at most."""
    monkeypatch.setattr(drain_module, "LOOP_WAKE_SECONDS", 0.5)
    monkeypatch.setattr(drain_module, "_last_looks", {})
    failed_once(calls, attempts)
    change(2, flush=False)
    assert drain_outboxes([RegionOutbox], wait_for_others=False).failures == 1  # looked
    assert attempts == [1, 2]
    change(3, flush=False)
    # Another loop round at once: no look, the shard keeps backing off.
    assert drain_outboxes([RegionOutbox], wait_for_others=False).shards == 0
    assert attempts == [1, 2]
    time.sleep(0.5)
    calls.failing = set()
    assert drain_outboxes([RegionOutbox], wait_for_others=False).failures == 0
    assert attempts == [1, 2, 3]
    assert RegionOutbox.objects.count() == 0
