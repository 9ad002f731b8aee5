"""Pause and resume (#46): a paused scope, shard or category is claimed neither by a drain
nor by the flush after commit, keeps its rows and their order, and is delivered in order
once resumed. On every backend: each claim statement of the fast paths is driven too."""

import pytest
from django.conf import settings
from django.db import router, transaction

from outbox import outbox_context
from outbox.backends import get_backend
from outbox.backends.base import Lease, ShardFilter
from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, OutboxPause, PausedPart, RegionOutbox, ShardLease
from outbox.models.pause import pause, resume
from outbox.shards import ShardKey
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category, Scope

pytestmark = committing

ORG = int(Scope.ORGANIZATION)


def _pause(part, model=RegionOutbox):
    return pause(model, part, using=router.db_for_write(model))


def _resume(part, model=RegionOutbox):
    return resume(model, part, using=router.db_for_write(model))


def _write(shard, *versions, category=Category.AUDIT_EVENT, flush=False):
    """Rows of shard `shard`, one object each, in order; flushed after commit or not."""
    with outbox_context(transaction.atomic(), flush=flush):
        for version in versions:
            RegionOutboxFactory(shard_identifier=shard, category=category, payload={"v": version})


def _delivered(calls):
    return [call["payload"]["v"] for call in calls.calls]


@pytest.mark.parametrize(
    "part",
    [PausedPart(ORG), PausedPart(ORG, 1), PausedPart.of_category(Category.AUDIT_EVENT)],
    ids=["scope", "shard", "category"],
)
def test_a_paused_part_is_claimed_by_neither_drain_nor_flush_and_resumes_in_order(calls, part):
    _pause(part)
    _write(1, "a1", "a2", flush=False)
    assert drain_outboxes().receiver_calls == 0
    _write(1, "a3", flush=True)  # the flush after commit claims nothing either
    _write(1, "a4", "a5", flush=True)
    assert drain_outboxes().receiver_calls == 0
    assert calls.calls == []
    kept = RegionOutbox.objects.order_by("id").values_list("payload", flat=True)
    assert [row["v"] for row in kept] == ["a1", "a2", "a3", "a4", "a5"]
    assert not ShardLease.objects.exists()  # nothing held, nothing backing off

    assert [found.part for found in _resume(part)] == [part]
    drain_outboxes()
    assert _delivered(calls) == ["a1", "a2", "a3", "a4", "a5"]
    assert not RegionOutbox.objects.exists()


def test_a_shard_pause_holds_only_that_shard(calls):
    _pause(PausedPart(ORG, 1))
    _write(1, "held", flush=True)
    _write(2, "flows", flush=True)
    _write(3, "drained")
    drain_outboxes()
    assert sorted(_delivered(calls)) == ["drained", "flows"]
    assert [row.payload["v"] for row in RegionOutbox.objects.all()] == ["held"]


def test_a_scope_pause_holds_only_that_scope_and_that_table(calls):
    user = int(Scope.USER)
    _pause(PausedPart(user))  # of the region table: the control table's USER flows
    with outbox_context(transaction.atomic(using="control")):
        ControlOutboxFactory(payload={"v": "control, flushed"})
    _write(1, "org, flushed", flush=True)
    assert sorted(_delivered(calls)) == ["control, flushed", "org, flushed"]

    _pause(PausedPart(user), model=ControlOutbox)  # now the control table's too
    with outbox_context(transaction.atomic(using="control")):
        ControlOutboxFactory(payload={"v": "control, held"})
    _write(1, "org, drained")  # another scope: flows
    drain_outboxes()
    assert _delivered(calls)[2:] == ["org, drained"]
    assert ControlOutbox.objects.get().payload == {"v": "control, held"}


def test_a_category_pause_holds_each_shard_at_its_first_row_of_that_category(calls):
    """Order per shard wins: rows before the paused category's first row are delivered,
    that row and everything after it (of any category) waits; other shards flow."""
    _pause(PausedPart.of_category(Category.LEDGER_ENTRY))
    _write(1, "before")
    _write(1, "ledger", category=Category.LEDGER_ENTRY)
    _write(1, "after, other category")
    _write(2, "other shard")
    _write(3, "no ledger row", flush=True)
    drain_outboxes()
    assert sorted(_delivered(calls)) == ["before", "no ledger row", "other shard"]
    kept = RegionOutbox.objects.order_by("id").values_list("payload", flat=True)
    assert [row["v"] for row in kept] == ["ledger", "after, other category"]
    _write(1, "later", flush=True)  # a flush of the held shard delivers nothing
    assert len(calls.calls) == 3

    _resume(PausedPart.of_category(Category.LEDGER_ENTRY))
    drain_outboxes()
    assert _delivered(calls)[3:] == ["ledger", "after, other category", "later"]


def test_a_shard_pause_names_its_region(calls):
    _pause(PausedPart(int(Scope.USER), 1, "eu"), model=ControlOutbox)
    with outbox_context(transaction.atomic(using="control"), flush=False):
        ControlOutboxFactory(region_name="eu", payload={"v": "eu"})
        ControlOutboxFactory(region_name="us", payload={"v": "us"})
    drain_outboxes([ControlOutbox])
    assert _delivered(calls) == ["us"]
    _resume(PausedPart(int(Scope.USER), 1, "eu"), model=ControlOutbox)
    drain_outboxes([ControlOutbox])
    assert _delivered(calls) == ["us", "eu"]


@pytest.mark.parametrize(
    "where",
    [
        ShardFilter(),
        ShardFilter(small=True),
        ShardFilter(after=ShardKey("", ORG, 1)),
        ShardFilter(small=True, after=ShardKey("", ORG, 1)),
        ShardFilter(shards=(ShardKey("", ORG, 1), ShardKey("", ORG, 2))),
    ],
    ids=["walk", "scan", "walk-around", "scan-after", "keys"],
)
def test_no_claim_statement_takes_a_paused_shard(where):
    _pause(PausedPart(ORG, 1))
    _write(1, "held")
    _write(2, "free")
    backend = get_backend(router.db_for_write(RegionOutbox))
    won = backend.claim(RegionOutbox, Lease("t1", "test", 30.0), where, 10)
    assert won == [ShardKey("", ORG, 2)]


@pytest.mark.parametrize("count", [1, 2], ids=["one-key", "keys"])
def test_no_claim_and_read_takes_a_paused_shard(count):
    _pause(PausedPart(ORG, 1))
    _write(1, "held")
    _write(2, "free")
    backend = get_backend(router.db_for_write(RegionOutbox))
    lease = Lease("t1", "test", 30.0)
    shards = [ShardKey("", ORG, 1), ShardKey("", ORG, 2)][:count]
    window = backend.claim_and_read(RegionOutbox, lease, shards, 100)
    if window is None:  # not on this backend: claim, then read
        backend.claim(RegionOutbox, lease, ShardFilter(shards=tuple(shards)), 10)
        window = backend.read_window(RegionOutbox, lease.shards, 100)
    expected = [] if count == 1 else [ShardKey("", ORG, 2)]
    assert lease.shards == expected
    assert [key for key, groups in window.shards.items() if groups] == expected


def test_a_read_stops_at_a_row_paused_after_its_shard_was_claimed():
    _write(1, "first")
    _write(1, "ledger", category=Category.LEDGER_ENTRY)
    backend = get_backend(router.db_for_write(RegionOutbox))
    lease = Lease("t1", "test", 30.0)
    backend.claim(RegionOutbox, lease, ShardFilter(), 10)
    _pause(PausedPart.of_category(Category.LEDGER_ENTRY))
    window = backend.read_window(RegionOutbox, lease.shards, 100)
    groups = window.shards[ShardKey("", ORG, 1)]
    assert [group.message.payload["v"] for group in groups] == ["first"]


def test_pausing_twice_is_one_pause_and_resuming_what_is_not_paused_is_nothing():
    part = PausedPart(ORG)
    first, created = _pause(part)
    again, created_again = _pause(part)
    assert (created, created_again, again.pk) == (True, False, first.pk)
    assert _resume(PausedPart(ORG, 5)) == []
    assert OutboxPause.objects.count() == 1
    assert str(first) == "outbox.regionoutbox scope ORGANIZATION paused"


@pytest.mark.skipif(
    settings.TEST_DB != "mariadb" or not settings.OUTBOX_FAST_PATH,
    reason="MariaDB's fast path (the ORM path compares regions in their own collations)",
)
def test_a_region_pause_holds_whatever_the_region_columns_collations(calls):
    """The pause table's region column keeps its own collation while the outbox's and
    the lease table's have another: the claim and the read still compare them."""
    import outbox.backends.mariadb.backend as mariadb
    from tests.test_mariadb_backend import column_collation, set_collation

    tables = [ControlOutbox._meta.db_table, ShardLease._meta.db_table]
    saved = {table: column_collation("control", table) for table in tables}
    try:
        for table in tables:
            set_collation("control", table, "utf8mb4_unicode_ci")
        mariadb._regions.clear()
        _pause(PausedPart(int(Scope.USER), 1, "eu"), model=ControlOutbox)
        with outbox_context(transaction.atomic(using="control"), flush=False):
            ControlOutboxFactory(region_name="eu", payload={"v": "eu"})
            ControlOutboxFactory(region_name="us", payload={"v": "us"})
        drain_outboxes([ControlOutbox])
        assert _delivered(calls) == ["us"]
    finally:
        for table, collation in saved.items():
            set_collation("control", table, collation)
        mariadb._regions.clear()
