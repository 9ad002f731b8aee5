"""A drain working through a backlog on a fast path settles each delivered batch on a
thread of its own while it works on the next one (`outbox.engine.pipeline`)."""

import threading
import time
from collections import Counter

import pytest
from django.db import DatabaseError, connection, connections, transaction

from outbox.engine import drain_outboxes
from outbox.engine.pipeline import LeaseKeeper
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.statements import statements_by_thread

pytestmark = committing


def client_connections():
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND backend_type = 'client backend'"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE db = DATABASE()"
            )
        return cursor.fetchone()[0]


def settles_to(count, seconds=5.0):
    """The count of client connections, once it reaches `count` (a server ends a
    closed connection's session a moment after the client closed it)."""
    deadline = time.monotonic() + seconds
    while (now := client_connections()) != count and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def test_a_backlog_is_settled_behind_with_the_same_statements(backlog, calls, settings):
    backlog(35)  # batches of 10, 10, 10 and 5 shards
    before = client_connections()
    with statements_by_thread() as behind:
        stats = drain_outboxes([RegionOutbox])
    assert (stats.shards, stats.receiver_calls, stats.rows_retired) == (35, 35, 35)
    assert sorted(c["shard_identifier"] for c in calls.calls) == list(range(35))
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()
    # The first full batch settles itself; the next two full ones are settled on the
    # thread, each while the batch after it runs; the last one (not full) by the drain.
    settled_behind = [sql for name, sql in behind if name.startswith("outbox-settle")]
    assert len(settled_behind) >= 2, behind
    assert settles_to(before) == before  # the thread's connection is closed

    backlog(35)
    settings.OUTBOX_SETTLE_IN_BACKGROUND = False
    with statements_by_thread() as alone:
        assert drain_outboxes([RegionOutbox]).rows_retired == 35
    assert {name for name, _ in alone} == {threading.current_thread().name}
    # Settled behind or not, a drain sends the same statements, but for the claims
    # made ahead of batches that never came: at the end of the backlog, two claims
    # ahead found nothing (`outbox.engine.pipeline`), and the drain claimed again.
    with_behind, on_its_own = Counter(sql for _, sql in behind), Counter(sql for _, sql in alone)
    assert not on_its_own - with_behind
    assert 1 <= (with_behind - on_its_own).total() <= 3, with_behind - on_its_own


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


def test_a_row_written_to_a_shard_whose_settle_is_in_flight_is_delivered_by_the_same_drain(
    backlog, calls
):
    # Batches of 10, 10, 10 and 5 shards: the third (shards 20-29) is settled on the
    # thread while the last one runs. Its delete of shard 25's row waits for a lock
    # held a second, so the drain's next claim finds shard 25 still leased; the drain
    # must wait for that settle and look again, since shard 25 got a row meanwhile.
    backlog(35)
    locked = threading.Event()

    def hold_row_lock(row_id):
        with transaction.atomic():
            RegionOutbox.objects.select_for_update().filter(id=row_id).exists()
            locked.set()
            time.sleep(1.0)
        connections.close_all()

    def write_newer(sender, kwargs):
        if kwargs["shard_identifier"] == 25 and kwargs["object_identifier"] == 25:
            row_id = RegionOutbox.objects.get(shard_identifier=25).id
            threading.Thread(target=hold_row_lock, args=(row_id,)).start()
            locked.wait(5)
            RegionOutboxFactory(shard_identifier=25, object_identifier=99, payload={"v": 2})

    calls.during_call = write_newer
    stats = drain_outboxes([RegionOutbox])
    assert stats.receiver_calls == 36
    assert [c["payload"] for c in calls.calls if c["object_identifier"] == 99] == [{"v": 2}]
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


@pytest.fixture
def refused_delete():
    """The database refuses to delete shard 25's rows (a trigger), until the test ends."""
    if connection.vendor == "postgresql":
        create = [
            """CREATE FUNCTION outbox_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN IF OLD.shard_identifier = 25 THEN RAISE EXCEPTION 'refused'; END IF;
               RETURN OLD; END $$""",
            """CREATE TRIGGER outbox_test_refuse BEFORE DELETE ON outbox_regionoutbox
               FOR EACH ROW EXECUTE FUNCTION outbox_test_refuse()""",
        ]
        drop = [
            "DROP TRIGGER outbox_test_refuse ON outbox_regionoutbox",
            "DROP FUNCTION outbox_test_refuse()",
        ]
    else:
        create = [
            """CREATE TRIGGER outbox_test_refuse BEFORE DELETE ON outbox_regionoutbox
               FOR EACH ROW BEGIN IF OLD.shard_identifier = 25 THEN
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF; END"""
        ]
        drop = ["DROP TRIGGER outbox_test_refuse"]
    with connection.cursor() as cursor:
        for statement in create:
            cursor.execute(statement)
    yield
    with connection.cursor() as cursor:
        for statement in drop:
            cursor.execute(statement)


def test_a_settle_behind_that_fails_releases_its_shards_and_raises(backlog, calls, refused_delete):
    backlog(40)  # shard 25 is in the third batch, settled on the thread
    with pytest.raises(DatabaseError, match="refused"):
        drain_outboxes([RegionOutbox])
    # Nothing stays leased (the keeper renews nothing), and only the batch whose settle
    # failed keeps its rows, to be delivered again.
    assert not LeaseKeeper.get()._holdings
    assert not ShardLease.objects.exists()
    left = set(RegionOutbox.objects.values_list("shard_identifier", flat=True))
    assert left == set(range(20, 30))
