"""A drain working through a backlog claims its next batch on a thread of its own while
it reads and delivers the current one (`outbox.engine.pipeline`)."""

import threading
import time
from collections import Counter

import pytest

from outbox.engine import drain_outboxes
from outbox.engine.pipeline import LeaseKeeper
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.statements import statements_by_thread
from tests.test_settle_behind import client_connections, settles_to

pytestmark = committing


def leased(shards, seconds=5.0):
    """The lease rows of these shards, once all exist (a claim ahead may still run)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = list(ShardLease.objects.filter(shard_identifier__in=shards))
        if len(rows) == len(shards):
            return rows
        time.sleep(0.01)
    return list(ShardLease.objects.filter(shard_identifier__in=shards))


def expiries(shards):
    return {lease.shard_identifier: lease.expires_at for lease in leased(shards)}


def test_a_backlog_claims_ahead_on_a_thread_and_delivers_everything_once(backlog, calls):
    backlog(45)
    before = client_connections()
    with statements_by_thread() as seen:
        stats = drain_outboxes([RegionOutbox])
    assert (stats.shards, stats.receiver_calls, stats.rows_retired) == (45, 45, 45)
    assert Counter(c["shard_identifier"] for c in calls.calls) == Counter(range(45))
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()
    # Batches 3, 4 and 5 and the empty claim after them are claimed on the thread.
    claimed_ahead = [sql for name, sql in seen if name.startswith("outbox-claim")]
    assert len(claimed_ahead) >= 3, seen
    assert not LeaseKeeper.get()._holdings
    assert settles_to(before) == before  # the thread's connection is closed


def test_a_batch_claimed_ahead_is_renewed_while_the_batch_before_it_runs_long(
    backlog, calls, settings
):
    settings.OUTBOX_LEASE_SECONDS = 1.5  # renewed every half second
    backlog(40)
    seen = {}

    def linger(sender, kwargs):
        if kwargs["shard_identifier"] == 25 and not seen:
            seen["claimed"] = expiries(range(30, 40))
            time.sleep(2.5)  # past the lease: only renewal keeps batch 4 ours
            seen["later"] = expiries(range(30, 40))

    calls.during_call = linger
    stats = drain_outboxes([RegionOutbox])
    assert len(seen["claimed"]) == 10  # batch 4 was claimed while batch 3 ran
    assert all(seen["later"][n] > seen["claimed"][n] for n in range(30, 40))
    assert stats.leases_lost == 0 and stats.rows_retired == 40
    assert Counter(c["shard_identifier"] for c in calls.calls) == Counter(range(40))


def test_a_drain_that_stops_lets_go_of_the_batch_claimed_ahead(backlog, calls):
    backlog(50)
    stop = threading.Event()

    def stop_soon(sender, kwargs):
        if kwargs["shard_identifier"] == 25:
            leased(range(30, 40))  # batch 4, claimed ahead
            stop.set()  # as a worker's graceful shutdown does

    calls.during_call = stop_soon
    stats = drain_outboxes([RegionOutbox], stop=stop)
    assert stats.rows_retired < 40
    # Batch 4 was never worked on: no lease of it is left, nor any renewal, and its
    # rows wait for the next drain, which delivers them once.
    assert not ShardLease.objects.exists() and not LeaseKeeper.get()._holdings
    left = set(RegionOutbox.objects.values_list("shard_identifier", flat=True))
    assert set(range(30, 50)) <= left
    calls.during_call = None
    assert drain_outboxes([RegionOutbox]).rows_retired == len(left)
    assert Counter(c["shard_identifier"] for c in calls.calls) == Counter(range(50))


def test_a_drain_that_fails_lets_go_of_the_batch_claimed_ahead(backlog, calls):
    backlog(50)

    def interrupt(sender, kwargs):
        if kwargs["shard_identifier"] == 25:
            leased(range(30, 40))  # batch 4, claimed ahead
            raise KeyboardInterrupt

    calls.during_call = interrupt
    with pytest.raises(KeyboardInterrupt):
        drain_outboxes([RegionOutbox])
    assert not ShardLease.objects.exists() and not LeaseKeeper.get()._holdings
    left = set(RegionOutbox.objects.values_list("shard_identifier", flat=True))
    assert set(range(25, 50)) <= left
    calls.during_call = None
    assert drain_outboxes([RegionOutbox]).rows_retired == len(left)
