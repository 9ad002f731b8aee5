"""Issue #45 (item 3): a drain whose claim lost a race looks again.

Drains started together walk the same due shards; the ones whose claims come back empty
used to end at once, leaving the backlog to the winners (four one-shot drains delivered
twice what one does, not four times). A drain now looks again while other drains hold
shards of the table and go on claiming, and ends once they stop claiming: a lease that
only a hung call keeps (the same lease, no new claim) does not hold it up for long.

The other drain is played here by a lease row, as a drain's claim writes it, whose
`claimed_at` moves as new claims would; a real race is in the bench's "Receivers that
wait" section (four one-shot processes against one)."""

import threading
import time
from datetime import timedelta

from django.db import connection
from django.utils import timezone

import outbox.engine.drain as engine_drain
from outbox.engine import drain_outboxes
from outbox.models import ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory

pytestmark = committing

OTHER = "other-host:1:1"


def held_by_another_drain(identifier: int) -> ShardLease:
    now = timezone.now()
    return ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=identifier,
        token="another-drain",
        holder=OTHER,
        claimed_at=now,
        expires_at=now + timedelta(seconds=60),
    )


@server_database_only
def test_a_drain_that_finds_every_shard_taken_waits_for_a_drain_that_moves_on(calls, monkeypatch):
    # A patience no thread stalls through on a loaded machine, and a move longer than
    # it: only moving keeps the drain looking.
    monkeypatch.setattr(engine_drain, "RACE_PATIENCE_SECONDS", 2.0)
    RegionOutboxFactory(shard_identifier=1, payload={"v": 1})
    lease = held_by_another_drain(1)
    moving = 3.0

    def other_drain():
        # Claims of its own, again and again, then its batch ends and lets shard 1 go.
        ends = time.monotonic() + moving
        try:
            while time.monotonic() < ends:
                time.sleep(0.05)
                ShardLease.objects.filter(pk=lease.pk).update(claimed_at=timezone.now())
            ShardLease.objects.filter(pk=lease.pk).delete()
        finally:
            connection.close()  # this thread's own

    other = threading.Thread(target=other_drain)
    started = time.monotonic()
    other.start()
    try:
        stats = drain_outboxes()
    finally:
        other.join()
    assert calls.payloads() == [{"v": 1}], "the drain ended before the shard came free"
    assert stats.shards == 1
    assert time.monotonic() - started >= moving


@server_database_only
def test_a_drain_that_wins_nothing_gives_up_however_much_the_others_claim(calls, monkeypatch):
    """A one-shot drain beside loops under steady writes: the others claim all the time
    and never let this shard go; the drain ends once it has won nothing for
    RACE_GIVE_UP_SECONDS (shortened here), not when they stop."""
    monkeypatch.setattr(engine_drain, "RACE_GIVE_UP_SECONDS", 1.0)
    monkeypatch.setattr(engine_drain, "RACE_PATIENCE_SECONDS", 2.0)  # moving all along
    RegionOutboxFactory(shard_identifier=1, payload={"held": 1})
    lease = held_by_another_drain(1)
    done = threading.Event()

    def other_drain():
        try:
            while not done.wait(0.05):
                ShardLease.objects.filter(pk=lease.pk).update(claimed_at=timezone.now())
        finally:
            connection.close()

    other = threading.Thread(target=other_drain)
    other.start()
    started = time.monotonic()
    try:
        drain_outboxes()
        took = time.monotonic() - started
    finally:
        done.set()
        other.join()
    assert calls.payloads() == []
    assert 1.0 <= took < 5.0, f"ended after {took:.2f}s"


def test_a_lease_that_does_not_move_holds_a_one_shot_drain_only_a_moment(calls):
    """A hung call's lease is renewed but claims nothing new: the drain delivers the
    other shards and ends within the patience, leaving that shard to its holder."""
    RegionOutboxFactory(shard_identifier=1, payload={"held": 1})
    RegionOutboxFactory(shard_identifier=2, payload={"free": 2})
    held_by_another_drain(1)
    started = time.monotonic()
    stats = drain_outboxes()
    took = time.monotonic() - started
    assert calls.payloads() == [{"free": 2}]
    assert stats.shards == 1
    patience = engine_drain.RACE_PATIENCE_SECONDS
    assert took < patience + 3.0, f"held up {took:.2f}s by a lease that did not move"


def test_with_no_other_drain_an_empty_claim_ends_the_drain_at_once(calls, monkeypatch):
    monkeypatch.setattr(engine_drain, "RACE_PATIENCE_SECONDS", 30.0)  # never waited out
    RegionOutboxFactory(shard_identifier=2, payload={"free": 2})
    started = time.monotonic()
    drain_outboxes()
    assert calls.payloads() == [{"free": 2}]
    assert time.monotonic() - started < 10.0
