"""OUTBOX_UNSETTLED_SECONDS: through a backlog of receivers that wait, a drain claims what it
delivers in about half of it, so it holds about that much delivered work before deleting
its rows and a drain that dies redelivers about that much; receivers that return at once
still fill whole batches."""

import time

import pytest

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from outbox.signals import shards_claimed
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing

CALL_SECONDS = 0.005


def backlog(shards, rows_each=1):
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=n)
            for shard in range(shards)
            for n in range(rows_each)
        ]
    )
    return shards * rows_each


def most_unsettled(calls, written, after):
    """Record, at each call, how many delivered rows are not deleted yet (as any other
    connection sees them); return a function giving the largest once `after` calls were
    made (a drain's first claim is sized before it has timed a receiver)."""
    seen = []

    def during(sender, kwargs):
        deleted = written - RegionOutbox.objects.count()
        seen.append(len(calls.calls) - deleted)
        time.sleep(CALL_SECONDS)

    calls.during_call = during
    return lambda: max(seen[after:])


def drained_claims(written):
    """Drain everything `written`; the size of each claim that won shards, in order."""
    claims = []

    def claimed(sender, shards, **kwargs):
        if shards:
            claims.append(shards)

    shards_claimed.connect(claimed)
    try:
        assert drain_outboxes().rows_retired == written
    finally:
        shards_claimed.disconnect(claimed)
    return claims


@pytest.mark.parametrize(("shards", "rows_each"), [(300, 1), (100, 3)])
def test_a_backlog_holds_about_the_bound_of_delivered_work(calls, settings, shards, rows_each):
    settings.OUTBOX_CONCURRENCY = 1
    settings.OUTBOX_UNSETTLED_SECONDS = 0.1  # 20 calls of 5 ms
    written = backlog(shards, rows_each)
    largest = most_unsettled(calls, written, after=16 * rows_each)
    assert drain_outboxes().rows_retired == written
    # Within the bound, with room for a noisy machine; batches of OUTBOX_BATCH_SHARDS
    # (100 shards, one settling behind another) would hold hundreds.
    assert largest() <= 60, largest()


def test_receivers_that_return_at_once_still_fill_whole_batches(calls, settings):
    settings.OUTBOX_CONCURRENCY = 1
    settings.OUTBOX_BATCH_SHARDS = 100
    # A bound of a millisecond: held to it, these receivers would take a shard or two a
    # claim, hundreds of claims in all.
    settings.OUTBOX_UNSETTLED_SECONDS = 0.001
    written = backlog(1000)
    claims = drained_claims(written)
    # 16 shards first, then full batches of 100 (or more where the backend widens them);
    # twice that leaves room for a machine too busy to keep a batch within a second.
    assert len(claims) <= 2 * (1 + -(-(written - 16) // 100)), claims


def test_receivers_that_wait_are_claimed_in_whole_rounds_of_the_slots(calls, settings):
    """A claim that left some slots idle in its last round would take as long as a full
    one: with 8 slots, claims after the first are multiples of 8 (the last may be less,
    when fewer shards are left)."""
    settings.OUTBOX_CONCURRENCY = 8
    settings.OUTBOX_BATCH_SHARDS = 1000
    settings.OUTBOX_UNSETTLED_SECONDS = 0.25  # about 50 shards a claim at 20 ms a round
    written = backlog(400)
    calls.during_call = lambda sender, kwargs: time.sleep(0.02)
    claims = drained_claims(written)
    assert len(claims) >= 3, claims
    assert all(size % 8 == 0 for size in claims[1:-1]), claims
