"""A drain working through a backlog on a fast path settles each delivered batch on a
thread of its own while it works on the next one (`outbox.engine.behind`)."""

import threading
from collections import Counter

import pytest
from django.db import connection

from outbox.backends import get_backend
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.statements import statements_by_thread

pytestmark = committing


@pytest.fixture
def backlog(settings):
    """One-message shards 0..n-1, claimed in batches of 10."""
    if not get_backend("default").settles_behind:
        pytest.skip("the portable path settles every batch itself")
    settings.OUTBOX_BATCH_SHARDS = 10
    settings.OUTBOX_BATCH_ROWS = 10

    def write(shards):
        RegionOutbox.objects.bulk_create(
            [
                RegionOutboxFactory.build(shard_identifier=n, object_identifier=n)
                for n in range(shards)
            ]
        )

    return write


def open_connections():
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE db = DATABASE()"
            )
        return cursor.fetchone()[0]


def test_a_backlog_is_settled_behind_with_the_same_statements(backlog, calls, settings):
    backlog(35)  # batches of 10, 10, 10 and 5 shards
    before = open_connections()
    with statements_by_thread() as behind:
        stats = drain_outboxes([RegionOutbox])
    assert (stats.shards, stats.receiver_calls, stats.rows_retired) == (35, 35, 35)
    assert sorted(c["shard_identifier"] for c in calls.calls) == list(range(35))
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()
    # The first full batch settles itself; the next two full ones are settled on the
    # thread, each while the batch after it runs; the last one (not full) by the drain.
    settled_behind = [sql for name, sql in behind if name.startswith("outbox-settle")]
    assert len(settled_behind) >= 2, behind
    assert open_connections() == before  # the thread's connection is closed

    backlog(35)
    settings.OUTBOX_SETTLE_IN_BACKGROUND = False
    with statements_by_thread() as alone:
        assert drain_outboxes([RegionOutbox]).rows_retired == 35
    assert {name for name, _ in alone} == {threading.current_thread().name}
    # Settled behind or not, a drain sends the same statements.
    assert Counter(sql for _, sql in behind) == Counter(sql for _, sql in alone)


def test_a_row_written_to_a_shard_being_settled_is_delivered_by_the_same_drain(backlog, calls):
    # Four full batches: shard 35 is in the last one, still leased while the drain's
    # next claim finds nothing; the drain settles it then, and claims again.
    backlog(40)

    def write_newer(sender, kwargs):
        if kwargs["shard_identifier"] == 35 and kwargs["payload"] != {"v": 2}:
            RegionOutboxFactory(shard_identifier=35, object_identifier=99, payload={"v": 2})

    calls.during_call = write_newer
    stats = drain_outboxes([RegionOutbox])
    assert stats.receiver_calls == 41
    assert [c["payload"] for c in calls.calls if c["object_identifier"] == 99] == [{"v": 2}]
    assert not RegionOutbox.objects.exists()


def test_a_lease_lost_before_a_settle_behind_is_counted_and_redelivered(backlog, calls):
    backlog(40)
    # While shard 25 (third batch) is delivered, its lease row disappears (as if it had
    # expired and been taken): its settle, on the thread, must leave its row alone.
    lost = []

    def lose_lease(sender, kwargs):
        if kwargs["shard_identifier"] == 25 and not lost:
            lost.append(ShardLease.objects.filter(shard_identifier=25).delete()[0])

    calls.during_call = lose_lease
    stats = drain_outboxes([RegionOutbox])
    assert lost == [1] and stats.leases_lost == 1
    delivered = Counter(c["shard_identifier"] for c in calls.calls)
    assert delivered[25] == 2 and all(delivered[n] == 1 for n in range(40) if n != 25)
    assert stats.rows_retired == 40 and not RegionOutbox.objects.exists()
