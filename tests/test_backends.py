"""The backend contract (`outbox.backends.base`), on whichever backend this database gets.

The suite runs these on SQLite, MariaDB and PostgreSQL with the fast path on and off,
so both backends are held to the same contract.
"""

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from outbox.backends import get_backend
from outbox.backends.base import (
    FailedGroup,
    Lease,
    OutboxBackend,
    Settlement,
    ShardFilter,
)
from outbox.backends.mariadb.backend import MariaDBBackend
from outbox.backends.portable import PortableBackend
from outbox.backends.postgresql.backend import PostgresBackend
from outbox.backends.select import backend_class
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.shards import ShardKey
from outbox.signals import message_processed
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Scope

pytestmark = committing


def key(identifier, scope=Scope.ORGANIZATION, region=""):
    return ShardKey(region, int(scope), identifier)


@pytest.fixture
def backend():
    return get_backend("default")


def lease(token="mine", seconds=30.0):
    return Lease(token, "test", seconds)


def test_one_function_picks_the_backend_from_vendor_and_setting(settings):
    fast = {"postgresql": PostgresBackend, "mysql": MariaDBBackend}
    settings.OUTBOX_FAST_PATH = True
    expected = fast.get(connection.vendor, PortableBackend)
    if not expected.supports(connection):  # MySQL, or MariaDB before 10.6
        expected = PortableBackend
    assert backend_class("default") is expected
    settings.OUTBOX_FAST_PATH = False
    assert backend_class("default") is PortableBackend
    assert isinstance(get_backend("default"), PortableBackend)


def test_no_backend_inherits_from_another():
    assert PostgresBackend.__mro__[1] is OutboxBackend
    assert MariaDBBackend.__mro__[1] is OutboxBackend
    assert PortableBackend.__mro__[1] is OutboxBackend


def test_claim_takes_due_free_shards_and_commits_the_lease(backend):
    for identifier in (1, 2, 3):
        RegionOutboxFactory(shard_identifier=identifier)
    RegionOutboxFactory(shard_identifier=4, scheduled_for=timezone.now() + timedelta(hours=1))
    mine = lease()
    won = backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    assert won == mine.shards == [key(1), key(2), key(3)]
    assert ShardLease.objects.of(RegionOutbox).held().with_token("mine").count() == 3
    # Nothing is left to claim: held shards are not claimed twice.
    assert backend.claim(RegionOutbox, lease("other"), ShardFilter(), 10) == []


def test_claim_honours_the_filter_and_the_limit(backend):
    for identifier in (1, 2, 3, 4, 5):
        RegionOutboxFactory(shard_identifier=identifier)
    assert backend.claim(RegionOutbox, lease("a"), ShardFilter(scopes=(99,)), 10) == []
    assert backend.claim(RegionOutbox, lease("b"), ShardFilter(identifiers=(4,)), 10) == [key(4)]
    named = ShardFilter(shards=(key(1), key(3), key(4), key(9)))
    assert backend.claim(RegionOutbox, lease("c"), named, 10) == [key(1), key(3)]
    assert len(backend.claim(RegionOutbox, lease("d"), ShardFilter(), 1)) == 1
    assert len(backend.claim(RegionOutbox, lease("e"), ShardFilter(), 10)) == 1
    assert ShardLease.objects.held().count() == 5


def test_claim_with_a_cursor_still_reaches_every_shard(backend):
    for identifier in (1, 2, 3):
        RegionOutboxFactory(shard_identifier=identifier)
    mine = lease()
    backend.claim(RegionOutbox, mine, ShardFilter(after=key(2)), 10)
    assert sorted(mine.shards) == [key(1), key(2), key(3)]


def test_claim_with_a_cursor_takes_the_shards_after_it_first_then_wraps_around(backend):
    if isinstance(backend, PortableBackend):
        pytest.skip("the portable path does not walk shards in key order: the cursor is a hint")
    for identifier in (1, 2, 3, 4, 5):
        RegionOutboxFactory(shard_identifier=identifier)
    assert backend.claim(RegionOutbox, lease("a"), ShardFilter(after=key(2)), 2) == [
        key(3),
        key(4),
    ]
    # 3 and 4 are held now: after 2 only 5 is left, then the walk wraps around to 1.
    won = backend.claim(RegionOutbox, lease("b"), ShardFilter(after=key(2)), 2)
    assert won == [key(1), key(5)]
    assert backend.claim(RegionOutbox, lease("c"), ShardFilter(after=key(4)), 10) == [key(2)]


def test_claim_skips_backing_off_and_retakes_expired_leases(backend):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    backend.claim(RegionOutbox, lease("dead"), ShardFilter(), 10)
    failure = FailedGroup(key(1), {}, "boom", 60.0)
    backend.settle(RegionOutbox, lease("dead"), Settlement(failed=[failure]))
    assert ShardLease.objects.backing_off().count() == 1
    ShardLease.objects.of_shard(key(2)).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert backend.claim(RegionOutbox, lease("new"), ShardFilter(), 10) == [key(2)]


def test_read_window_coalesces_in_order_of_the_oldest_row(backend):
    rows = [
        RegionOutboxFactory(shard_identifier=1, object_identifier=obj, payload={"v": v})
        for obj, v in [(1, "a1"), (2, "b1"), (1, "a2")]
    ]
    window = backend.read_window(RegionOutbox, [key(1)], 100)
    groups = window.shards[key(1)]
    assert [g.object_identifier for g in groups] == [1, 2]
    assert groups[0].row_ids == [rows[0].id, rows[2].id] and groups[0].attempts == [0, 0]
    assert groups[0].message.payload == {"v": "a2"} and groups[1].message.payload == {"v": "b1"}
    assert window.incomplete == set()


def test_read_window_marks_shards_that_may_continue(backend):
    for n in range(120):
        RegionOutboxFactory(shard_identifier=1, object_identifier=n)
    window = backend.read_window(RegionOutbox, [key(1)], 100)
    assert key(1) in window.incomplete
    assert sum(len(g.row_ids) for g in window.shards[key(1)]) >= 100


def test_read_window_carries_the_control_fields():
    ControlOutboxFactory(region_name="eu", shard_identifier=7, payload={"v": 1})
    shard = key(7, scope=Scope.USER, region="eu")
    window = get_backend("control").read_window(ControlOutbox, [shard], 100)
    message = window.shards[shard][0].message
    assert message.region_name == "eu" and message.payload == {"v": 1}
    assert message.date_added is not None and message.scheduled_for is not None


def test_settle_deletes_reschedules_and_releases_in_one_go(backend):
    done = RegionOutboxFactory(shard_identifier=1)
    failed = RegionOutboxFactory(shard_identifier=2)
    mine = lease()
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    settled = backend.settle(
        RegionOutbox,
        mine,
        Settlement(
            delivered={key(1): [done.id]},
            failed=[FailedGroup(key(2), {failed.id: 45.0}, "it broke", 45.0)],
            release=[key(1)],
        ),
    )
    assert (settled.deleted, settled.lost) == (1, frozenset())
    row = RegionOutbox.objects.get()
    assert row.id == failed.id and row.attempts == 1 and row.last_error == "it broke"
    assert row.scheduled_for >= timezone.now() + timedelta(seconds=40)
    backing_off = ShardLease.objects.get()
    assert backing_off.token is None and backing_off.shard_identifier == 2


def test_settle_touches_nothing_of_a_lost_shard(backend):
    RegionOutboxFactory(shard_identifier=1)
    row = RegionOutboxFactory(shard_identifier=2)
    mine = lease()
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    ShardLease.objects.of_shard(key(2)).update(token="theirs")
    failure = FailedGroup(key(2), {row.id: 45.0}, "it broke", 45.0)
    settled = backend.settle(
        RegionOutbox, mine, Settlement(delivered={key(2): [row.id]}, failed=[failure])
    )
    assert (settled.deleted, settled.lost) == (0, {key(2)})
    assert RegionOutbox.objects.get(id=row.id).attempts == 0
    assert ShardLease.objects.get(shard_identifier=2).token == "theirs"


def test_settle_buries_dead_groups_and_keeps_their_rows(backend):
    older = RegionOutboxFactory(shard_identifier=1, object_identifier=7)
    newest = RegionOutboxFactory(shard_identifier=1, object_identifier=7)
    later = RegionOutboxFactory(shard_identifier=1, object_identifier=8)
    mine = lease()
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    dead = FailedGroup(
        key(1), {older.id: 0.0, newest.id: 0.0}, "gone", 0.0, "Traceback ...", '["a.b"]'
    )
    settled = backend.settle(RegionOutbox, mine, Settlement(dead=[dead], release=[key(1)]))
    assert (settled.deleted, settled.lost) == (0, frozenset())
    buried = {row.id: row for row in RegionOutbox.objects.dead()}
    assert set(buried) == {older.id, newest.id}
    for row in buried.values():
        assert row.attempts == 1 and row.last_error == "gone"
        assert row.last_traceback == "Traceback ..." and row.first_attempt_at is not None
    assert (buried[older.id].delivered_to, buried[newest.id].delivered_to) == ("", '["a.b"]')
    assert list(RegionOutbox.objects.pending().values_list("id", flat=True)) == [later.id]
    assert not ShardLease.objects.exists()  # the shard goes on: released, not backed off
    # Dead rows are never read, and never make a shard due or block it.
    window = backend.read_window(RegionOutbox, [key(1)], 100)
    assert [group.row_ids for group in window.shards[key(1)]] == [[later.id]]
    RegionOutbox.objects.filter(id=later.id).delete()
    assert backend.claim(RegionOutbox, lease("next"), ShardFilter(), 10) == []


def test_claim_and_read_stop_at_the_first_row_not_yet_due(backend):
    later = timezone.now() + timedelta(hours=1)
    RegionOutboxFactory(shard_identifier=1, scheduled_for=later)
    RegionOutboxFactory(shard_identifier=1)  # due, but behind a future row
    first = RegionOutboxFactory(shard_identifier=2)
    RegionOutboxFactory(shard_identifier=2, scheduled_for=later)
    mine = lease()
    assert backend.claim(RegionOutbox, mine, ShardFilter(), 10) == [key(2)]
    window = backend.read_window(RegionOutbox, [key(2)], 100)
    assert [group.row_ids for group in window.shards[key(2)]] == [[first.id]]
    assert window.incomplete == set()


def claims_and_reads(backend, method="claim_and_read"):
    """Skip unless `backend` must claim and read in one step. PostgreSQL's fast path must:
    there the base class's None ("claim, then read") is a failure, not a reason to skip.
    So must any other backend that has a `claim_and_read` (or `claim_due_and_read`) of
    its own; the rest have none and the engine claims, then reads."""
    database = connections[backend.using]
    fast_postgres = database.vendor == "postgresql" and PostgresBackend.supports(database)
    if django_settings.OUTBOX_FAST_PATH and fast_postgres:
        assert isinstance(backend, PostgresBackend), backend
        return
    if getattr(type(backend), method) is getattr(OutboxBackend, method):
        pytest.skip(f"{type(backend).__name__} claims, then reads")


def test_a_claim_of_due_shards_with_its_read_takes_what_a_claim_takes(backend):
    """A drain loop's claim with its first read (`claim_due_and_read`): the due, free
    shards a claim takes (not one another lease holds, not one whose first row waits),
    in key order from after the given key and around, each read as a read does: the
    newest payload of a group, the shard cut at its first row not yet due."""
    later = timezone.now() + timedelta(hours=1)
    RegionOutboxFactory(shard_identifier=1, scheduled_for=later)  # not due
    older = RegionOutboxFactory(shard_identifier=2, object_identifier=7, payload={"v": 1})
    newest = RegionOutboxFactory(shard_identifier=2, object_identifier=7, payload={"v": 2})
    RegionOutboxFactory(shard_identifier=2, scheduled_for=later)
    RegionOutboxFactory(shard_identifier=2)  # due, behind the cut
    RegionOutboxFactory(shard_identifier=3)
    alone = RegionOutboxFactory(shard_identifier=4, payload={"v": 3})
    theirs = lease("theirs")
    assert backend.claim(RegionOutbox, theirs, ShardFilter(shards=(key(3),)), 1) == [key(3)]
    claims_and_reads(backend, "claim_due_and_read")
    mine = lease()
    window = backend.claim_due_and_read(RegionOutbox, mine, ShardFilter(), 10, 100)
    assert window is not None  # the backend offers it: None would be a silent fallback
    assert mine.shards == [key(2), key(4)]
    groups = window.shards[key(2)]
    assert [(g.row_ids, g.message.payload) for g in groups] == [([older.id, newest.id], {"v": 2})]
    assert [g.row_ids for g in window.shards[key(4)]] == [[alone.id]]
    assert window.incomplete == set()
    backend.release(RegionOutbox, mine, mine.shards)
    # One shard at a time: from the start, then after key 2 (walking on from there).
    first, after = lease("first"), lease("after")
    assert backend.claim_due_and_read(RegionOutbox, first, ShardFilter(), 1, 100) is not None
    assert first.shards == [key(2)]
    backend.release(RegionOutbox, first, first.shards)
    window = backend.claim_due_and_read(
        RegionOutbox, after, ShardFilter(after=key(2)), 1, 100, timed=True
    )
    assert window is not None and after.shards == [key(4)]
    assert window.shards[key(4)][0].message.date_added is not None  # timed: for the lag


@pytest.mark.parametrize("keys", [1, 2], ids=["one key", "several keys"])
def test_claim_and_read_coalesce_and_cut_as_a_read_does(backend, keys):
    """A flush's claim and read in one step: each group's newest payload, the shard cut
    at its first row not yet due, the rows behind the cut left alone."""
    later = timezone.now() + timedelta(hours=1)
    older = RegionOutboxFactory(shard_identifier=1, object_identifier=7, payload={"v": 1})
    other = RegionOutboxFactory(shard_identifier=1, object_identifier=8, payload={"v": 9})
    newest = RegionOutboxFactory(shard_identifier=1, object_identifier=7, payload={"v": 2})
    RegionOutboxFactory(shard_identifier=1, object_identifier=7, scheduled_for=later)
    RegionOutboxFactory(shard_identifier=1, object_identifier=8)  # due, behind the cut
    alone = RegionOutboxFactory(shard_identifier=2, payload={"v": 3})
    shards = [key(1), key(2)][:keys]
    mine = lease()
    claims_and_reads(backend)
    window = backend.claim_and_read(RegionOutbox, mine, shards, 100)
    assert window is not None  # the backend offers it: None would be a silent fallback
    assert mine.shards == shards
    groups = window.shards[key(1)]
    assert [(g.object_identifier, g.row_ids) for g in groups] == [
        (7, [older.id, newest.id]),
        (8, [other.id]),
    ]
    assert [g.message.payload for g in groups] == [{"v": 2}, {"v": 9}]
    assert window.incomplete == set()
    if keys == 2:
        assert [g.row_ids for g in window.shards[key(2)]] == [[alone.id]]
        assert window.shards[key(2)][0].message.payload == {"v": 3}


def test_claim_and_read_carries_the_control_fields():
    ControlOutboxFactory(region_name="eu", shard_identifier=7, payload={"v": 1})
    shard = key(7, scope=Scope.USER, region="eu")
    backend = get_backend("control")
    claims_and_reads(backend)
    window = backend.claim_and_read(ControlOutbox, lease(), [shard], 100)
    assert window is not None  # the backend offers it: None would be a silent fallback
    message = window.shards[shard][0].message
    assert message.region_name == "eu" and message.payload == {"v": 1}
    assert message.date_added is not None and message.scheduled_for is not None


def test_failed_settle_records_traceback_and_receivers_done(backend):
    older = RegionOutboxFactory(shard_identifier=1, object_identifier=7)
    newest = RegionOutboxFactory(shard_identifier=1, object_identifier=7)
    mine = lease()
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    failure = FailedGroup(
        key(1), {older.id: 30.0, newest.id: 30.0}, "boom", 30.0, "Traceback", '["m.f"]'
    )
    backend.settle(RegionOutbox, mine, Settlement(failed=[failure]))
    rows = {row.id: row for row in RegionOutbox.objects.all()}
    assert rows[newest.id].delivered_to == '["m.f"]' and rows[older.id].delivered_to == ""
    assert rows[older.id].last_traceback == "Traceback" and rows[older.id].dead_at is None
    assert rows[newest.id].scheduled_for >= timezone.now() + timedelta(seconds=25)
    # The fast path reads the receivers done with the newest row's message.
    ShardLease.objects.all().delete()
    RegionOutbox.objects.update(scheduled_for=Now())
    window = backend.read_window(RegionOutbox, [key(1)], 100)
    assert window.shards[key(1)][0].message.delivered_to == '["m.f"]'


def test_renew_reports_the_shards_still_held(backend):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    mine = lease(seconds=3600.0)
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    ShardLease.objects.of_shard(key(2)).update(token="theirs")
    assert backend.renew(RegionOutbox, mine) == {key(1)}
    expires = ShardLease.objects.get(token="mine").expires_at
    assert expires >= timezone.now() + timedelta(minutes=59)


def test_release_drops_only_our_leases(backend):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    mine = lease()
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    ShardLease.objects.of_shard(key(2)).update(token="theirs")
    backend.release(RegionOutbox, mine, [key(1), key(2)])
    assert list(ShardLease.objects.values_list("token", flat=True)) == ["theirs"]
    backend.release(RegionOutbox, mine, [])  # nothing to do is fine


def test_the_engine_not_a_signal_decides_whether_date_added_is_read(backend):
    """A backend reads the newest rows' date_added when the caller asks (`timed`), and
    only then on the fast paths, whatever receivers `message_processed` has."""
    RegionOutboxFactory(shard_identifier=1)

    def processed(**kwargs):
        pass

    message_processed.connect(processed, sender=RegionOutbox, weak=False)
    try:
        plain = backend.read_window(RegionOutbox, [key(1)], 10)
        timed = backend.read_window(RegionOutbox, [key(1)], 10, timed=True)
    finally:
        message_processed.disconnect(processed, sender=RegionOutbox)
    [group] = timed.shards[key(1)]
    assert group.message.date_added is not None
    if not isinstance(backend, PortableBackend):  # the ORM reads whole rows anyway
        [group] = plain.shards[key(1)]
        assert group.message.date_added is None


def test_a_window_is_read_without_jit_and_the_session_keeps_its_setting(backend):
    """PostgreSQL's JIT compiled a window's read anew at every read (half its time): the
    reads turn it off for themselves, in autocommit, and the session's value stays. In a
    transaction of the caller's the read leaves JIT alone, so nothing outlives it."""
    if not isinstance(backend, PostgresBackend):
        pytest.skip("JIT is PostgreSQL's")
    connection.ensure_connection()
    if getattr(connection.connection, "prepare_threshold", None) is not None:
        pytest.skip("a server-side binding cursor sends one statement at a time")
    asked = "SELECT current_setting('jit')"
    with connection.cursor() as cursor:
        cursor.execute("SET jit = on")
    try:
        assert backend._fetch(asked, [], reads=True) == [("off",)]
        assert backend._fetch(asked, []) == [("on",)]  # statements that read no window
        assert backend._fetch(asked, [], reads=True) == [("off",)]
        with connection.cursor() as cursor:
            cursor.execute("SHOW jit")
            assert cursor.fetchone() == ("on",)  # nothing outlived the read
        with transaction.atomic():
            assert backend._fetch(asked, [], reads=True) == [("on",)]
        RegionOutboxFactory(shard_identifier=7)
        window = backend.read_window(RegionOutbox, [key(7)], 100)
        assert [group.object_identifier for group in window.shards[key(7)]] == [
            RegionOutbox.objects.get().object_identifier
        ]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET jit")
