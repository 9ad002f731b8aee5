"""The drain engine: coalescing, order, failure isolation, scheduling, leases."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox.backends import get_backend
from outbox.backends.base import Lease, Settlement, ShardFilter
from outbox.backends.mariadb.backend import MariaDBBackend
from outbox.backends.postgresql.backend import PostgresBackend
from outbox.engine import Drainer, drain_outboxes
from outbox.exceptions import DrainInTransaction
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.signals import process_region_outbox
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.models import Ledger
from tests.testapp.receivers import record

pytestmark = committing


def test_coalescing_calls_once_with_the_newest_payload(calls):
    for version in range(1, 4):
        RegionOutboxFactory(object_identifier=42, payload={"v": version})
    stats = drain_outboxes()
    assert calls.payloads() == [{"v": 3}]
    assert (stats.receiver_calls, stats.rows_retired, stats.coalesced) == (1, 3, 2)
    assert not RegionOutbox.objects.exists()


def test_row_written_during_processing_survives_and_is_delivered_later(calls):
    def write_newer(sender, kwargs):
        if kwargs["payload"] == {"v": 1}:
            RegionOutboxFactory(object_identifier=42, payload={"v": 2})

    calls.during_call = write_newer
    RegionOutboxFactory(object_identifier=42, payload={"v": 1})
    drain_outboxes()
    assert calls.payloads() == [{"v": 1}, {"v": 2}]
    assert not RegionOutbox.objects.exists()


def test_groups_of_a_shard_go_in_order_of_their_oldest_row(calls):
    for object_identifier, version in [(1, "a1"), (2, "b1"), (1, "a2"), (3, "c1"), (2, "b2")]:
        RegionOutboxFactory(object_identifier=object_identifier, payload={"v": version})
    drain_outboxes()
    assert calls.payloads() == [{"v": "a2"}, {"v": "b2"}, {"v": "c1"}]


def test_failing_receiver_blocks_only_its_shard_and_backs_off(calls):
    calls.failing = {1}
    before = timezone.now()
    RegionOutboxFactory(shard_identifier=1, object_identifier=10, payload={"v": "first"})
    RegionOutboxFactory(shard_identifier=1, object_identifier=11, payload={"v": "waits"})
    RegionOutboxFactory(shard_identifier=2, payload={"v": "other shard"})
    stats = drain_outboxes()
    assert calls.payloads() == [{"v": "other shard"}]
    assert stats.failures == 1
    failed, waiting = RegionOutbox.objects.order_by("id")
    assert failed.attempts == 1
    assert failed.first_attempt_at is not None and failed.last_attempt_at is not None
    assert "receiver failed for shard 1" in failed.last_error
    # OUTBOX_BACKOFF_BASE_SECONDS=30 in the test settings: between 15 and 30 seconds.
    assert failed.scheduled_for >= before + timedelta(seconds=14)
    assert waiting.attempts == 0
    # The shard stays blocked: a new due row wakes it for one early attempt
    # (tests/test_wake_backed_off.py), which fails again and backs off, so its later
    # groups still wait in order.
    RegionOutboxFactory(shard_identifier=1, object_identifier=12)
    assert drain_outboxes().failures == 1
    assert calls.payloads() == [{"v": "other shard"}]
    lease = ShardLease.objects.get()
    assert lease.token is None and lease.expires_at >= before + timedelta(seconds=14)
    assert drain_outboxes().failures == 0  # no newer write: no attempt before the back-off


def test_backed_off_shard_is_retried_once_due(calls):
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1, payload={"v": "x"})
    drain_outboxes()
    calls.failing = set()
    past = timezone.now() - timedelta(seconds=1)
    RegionOutbox.objects.update(scheduled_for=past)
    ShardLease.objects.update(expires_at=past)
    drain_outboxes()
    assert calls.payloads() == [{"v": "x"}]
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_attempts_grow_and_keep_the_first_attempt_time(calls):
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    first = RegionOutbox.objects.get()
    RegionOutbox.objects.update(scheduled_for=timezone.now() - timedelta(seconds=1))
    ShardLease.objects.all().delete()
    drain_outboxes()
    second = RegionOutbox.objects.get()
    assert second.attempts == 2
    assert second.first_attempt_at == first.first_attempt_at
    assert second.last_attempt_at >= first.last_attempt_at


def test_a_future_row_is_not_delivered_before_its_time(calls):
    later = timezone.now() + timedelta(hours=1)
    RegionOutboxFactory(shard_identifier=1, scheduled_for=later, payload={"v": "future"})
    assert drain_outboxes().receiver_calls == 0
    assert RegionOutbox.objects.count() == 1


def test_a_shard_stops_at_its_first_row_not_yet_due_keeping_order(calls):
    later = timezone.now() + timedelta(hours=1)
    RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "due first"})
    RegionOutboxFactory(
        shard_identifier=1, object_identifier=2, scheduled_for=later, payload={"v": "future"}
    )
    RegionOutboxFactory(shard_identifier=1, object_identifier=3, payload={"v": "due, waits"})
    RegionOutboxFactory(shard_identifier=2, payload={"v": "other shard"})
    drain_outboxes()
    # Shard 1 goes up to its future row; the due row behind it waits, in order.
    assert sorted(p["v"] for p in calls.payloads()) == ["due first", "other shard"]
    assert sorted(RegionOutbox.objects.values_list("object_identifier", flat=True)) == [2, 3]
    assert not ShardLease.objects.exists()  # nothing holds or blocks the shard
    RegionOutbox.objects.filter(object_identifier=2).update(scheduled_for=Now())
    drain_outboxes()
    assert [p["v"] for p in calls.payloads()][2:] == ["future", "due, waits"]


def test_a_newer_future_row_of_a_group_is_not_delivered_with_it(calls):
    later = timezone.now() + timedelta(hours=1)
    RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": 1})
    RegionOutboxFactory(
        shard_identifier=1, object_identifier=1, scheduled_for=later, payload={"v": 2}
    )
    drain_outboxes()
    assert calls.payloads() == [{"v": 1}]
    assert list(RegionOutbox.objects.values_list("payload", flat=True)) == [{"v": 2}]


def test_message_without_receiver_is_kept(calls):
    process_region_outbox.disconnect(record, sender=Category.AUDIT_EVENT)
    try:
        RegionOutboxFactory(shard_identifier=5)
        stats = drain_outboxes()
    finally:
        process_region_outbox.connect(record, sender=Category.AUDIT_EVENT)
    assert stats.failures == 1
    row = RegionOutbox.objects.get()
    assert "no receiver" in row.last_error and row.attempts == 1


def test_transactional_receiver_commits_with_the_delete(calls):
    RegionOutboxFactory(category=Category.LEDGER_ENTRY, object_identifier=1)
    RegionOutboxFactory(category=Category.LEDGER_ENTRY, object_identifier=2)
    drain_outboxes()
    assert sorted(Ledger.objects.values_list("entry", flat=True)) == [1, 2]
    assert not RegionOutbox.objects.exists()


def test_failing_transactional_receiver_rolls_its_writes_back(calls):
    calls.failing = {1}
    RegionOutboxFactory(category=Category.LEDGER_ENTRY, object_identifier=1)
    drain_outboxes()
    assert not Ledger.objects.exists()
    assert RegionOutbox.objects.get().attempts == 1


def test_interrupt_is_never_success_and_releases_leases(calls):
    def interrupt(sender, kwargs):
        if kwargs["payload"] == {"v": "boom"}:
            raise KeyboardInterrupt

    calls.during_call = interrupt
    RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "ok"})
    RegionOutboxFactory(shard_identifier=1, object_identifier=2, payload={"v": "boom"})
    with pytest.raises(KeyboardInterrupt):
        drain_outboxes()
    # The group delivered before the interrupt is retired; the interrupted one is kept.
    assert list(RegionOutbox.objects.values_list("payload", flat=True)) == [{"v": "boom"}]
    assert RegionOutbox.objects.get().attempts == 0
    assert not ShardLease.objects.exists()


def test_draining_inside_a_transaction_is_refused():
    with transaction.atomic(), pytest.raises(DrainInTransaction):
        drain_outboxes()


def test_control_messages_carry_region_and_times(calls):
    ControlOutboxFactory(region_name="eu", shard_identifier=1, payload={"v": "eu"})
    ControlOutboxFactory(region_name="us", shard_identifier=1, payload={"v": "us"})
    stats = drain_outboxes([ControlOutbox])
    assert stats.shards == 2  # same scope and identifier, different regions
    call = next(c for c in calls.calls if c["region_name"] == "eu")
    assert call["payload"] == {"v": "eu"}
    assert call["date_added"] is not None and call["scheduled_for"] is not None


def test_filters_limit_the_drain(calls):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    drain_outboxes(identifiers=[2])
    assert [c["shard_identifier"] for c in calls.calls] == [2]


def test_a_held_shard_is_skipped_by_other_workers(calls):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    lease = Drainer(RegionOutbox, identifiers=[1]).reserve(1, "someone-else")
    assert len(lease.shards) == 1
    drain_outboxes()
    assert [c["shard_identifier"] for c in calls.calls] == [2]


def test_expired_lease_is_taken_over(calls):
    RegionOutboxFactory(shard_identifier=1)
    Drainer(RegionOutbox).reserve(1, "dead-worker")
    ShardLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    drain_outboxes()
    assert len(calls.calls) == 1
    assert not ShardLease.objects.exists()


def test_windows_smaller_than_the_backlog_still_drain_everything(calls, settings):
    settings.OUTBOX_BATCH_ROWS = 3
    for n in range(10):
        RegionOutboxFactory(shard_identifier=n % 2, object_identifier=n, payload={"n": n})
    drain_outboxes()
    assert sorted(p["n"] for p in calls.payloads()) == list(range(10))
    for shard in (0, 1):
        delivered = [c["payload"]["n"] for c in calls.calls if c["shard_identifier"] == shard]
        assert delivered == sorted(delivered)


def engine_statements(captured):
    # Transaction control differs between Django versions (5.2 wraps bulk_create in one).
    return [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]


@pytest.mark.parametrize(("shards", "groups"), [(1, 1), (1, 50), (100, 1), (100, 50)])
def test_query_count_does_not_grow_with_shards_or_groups(shards, groups, settings):
    # 32 slots: the first claim (4 shards a slot) takes all 100 shards, and the
    # statements below stay on the drain's own connection while slots deliver.
    settings.OUTBOX_CONCURRENCY = 32
    settings.OUTBOX_BATCH_SHARDS = 100
    settings.OUTBOX_BATCH_ROWS = 10_000
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=n)
            for shard in range(shards)
            for n in range(groups)
        ]
    )
    with CaptureQueriesContext(connection) as captured:
        stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == shards * groups
    # PostgreSQL: claim (walk + lease in one statement), read window, settle, and the
    # empty claim that ends the drain (one statement: after the cursor, then wrapped
    # around); after a full batch (100 shards) of one-row shards that claim scans first
    # (`claim_scan`), one more. MariaDB:
    # walk, lease, read window, delete, release, and the empty claim (two walks).
    # Portable: find due, claim (update, insert, read back), read window (rows,
    # payloads), delete, release, and the empty find that ends the drain. Each drain
    # first looks for back-offs a new message ends (`outbox.backends.wake`): one more;
    # and, the claim having come back empty, whether other drains hold shards
    # (`held_by_others`: none here, so the drain ends): one more.
    postgres = 6 + (shards == 100 and groups == 1)
    expected = {PostgresBackend: postgres, MariaDBBackend: 9}.get(type(get_backend("default")), 11)
    assert len(engine_statements(captured)) == expected, engine_statements(captured)


@pytest.mark.parametrize("shards", [500, 1500])
def test_one_message_per_shard_costs_statements_per_window_not_per_shard(shards, settings):
    settings.OUTBOX_CONCURRENCY = 32  # a first claim of 4 shards a slot: all 100
    settings.OUTBOX_BATCH_SHARDS = 100
    settings.OUTBOX_BATCH_ROWS = 2000
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=shard) for shard in range(shards)]
    )
    with CaptureQueriesContext(connection) as captured:
        stats = drain_outboxes([RegionOutbox])
    assert (stats.rows_retired, stats.shards) == (shards, shards)
    statements = engine_statements(captured)
    if isinstance(get_backend("default"), PostgresBackend):
        # A full batch of 100 shards finds them small, so the next batch claims up to
        # BATCH_ROWS (2000) shards: the rest, by a scan after the cursor, then (finding
        # fewer) a walk after it and wrapped around, in one statement. Claim, read,
        # settle; claim (scan, walk around), read, settle; the empty claim (a walk
        # around: that batch was not full). As many for 500 shards as for 1500. And
        # the look for back-offs a new message ends, as every drain begins; the look
        # at other drains' leases after the empty claim.
        assert len(statements) == 10, statements
    elif isinstance(get_backend("default"), MariaDBBackend):
        # The same batches, each step a statement: walk, lease, read, delete, release;
        # walk (after, until), lease, read, delete, release; the empty walks (after,
        # until); the look for back-offs to end; the look at other drains' leases.
        # tests/test_mariadb_backend.py pins it for bigger batches.
        assert len(statements) == 15, statements
    else:
        # The portable path keeps batches of BATCH_SHARDS: 8 statements per batch.
        batches = -(-shards // 100)
        assert len(statements) <= 8 * batches + 3, len(statements)


def test_control_shards_with_any_region_name_claim_read_and_settle(calls):
    regions = ["eu", 'a"b', "c\\d", "e,f", "{g}", "NULL", " h ", "ü"]
    for region in regions:
        ControlOutboxFactory(region_name=region, shard_identifier=1, payload={"r": region})
    stats = drain_outboxes([ControlOutbox])
    assert (stats.shards, stats.rows_retired) == (len(regions), len(regions))
    assert sorted(c["region_name"] for c in calls.calls) == sorted(regions)
    assert all(c["payload"] == {"r": c["region_name"]} for c in calls.calls)
    assert not ControlOutbox.objects.exists() and not ShardLease.objects.exists()


def test_drain_shards_takes_only_the_given_shards(calls):
    for shard in (1, 2, 3):
        RegionOutboxFactory(shard_identifier=shard, object_identifier=shard)
    keys = [row.shard_key for row in RegionOutbox.objects.filter(shard_identifier__in=[1, 3])]
    stats = Drainer(RegionOutbox).drain_shards(keys)
    assert stats.shards == 2
    assert sorted(c["shard_identifier"] for c in calls.calls) == [1, 3]


@pytest.mark.parametrize("finished", [True, False])
def test_settle_deletes_only_rows_of_shards_still_held(finished):
    # finished: the shards are released too (on PostgreSQL, the one-statement settle
    # that checks the lease by deleting it); else they stay leased.
    first = RegionOutboxFactory(shard_identifier=1)
    second = RegionOutboxFactory(shard_identifier=2)
    backend = get_backend("default")
    lease = Lease("mine", "test", 30.0)
    backend.claim(RegionOutbox, lease, ShardFilter(), 2)
    assert len(lease.shards) == 2
    # Another worker took shard 2 over after our lease expired.
    ShardLease.objects.filter(shard_identifier=2).update(token="theirs")
    settled = backend.settle(
        RegionOutbox,
        lease,
        Settlement(
            delivered={first.shard_key: [first.id], second.shard_key: [second.id]},
            release=[first.shard_key, second.shard_key] if finished else [],
        ),
    )
    assert (settled.deleted, settled.lost) == (1, {second.shard_key})
    assert list(RegionOutbox.objects.values_list("id", flat=True)) == [second.id]
    tokens = sorted(ShardLease.objects.values_list("token", flat=True))
    assert tokens == (["theirs"] if finished else ["mine", "theirs"])


def test_reserve_and_unreserve_hand_shards_to_a_scheduler(calls):
    for shard in (1, 2, 3):
        RegionOutboxFactory(shard_identifier=shard)
    reservation = Drainer(RegionOutbox).reserve(2, "queued:test")
    assert len(reservation.shards) == 2
    reserved = ShardLease.objects.of(RegionOutbox).held().with_token(reservation.token)
    assert set(reserved.values_list("holder", flat=True)) == {"queued:test"}
    assert drain_outboxes().shards == 1  # the reserved shards are not drained
    ShardLease.objects.of_shard(reservation.shards[1]).update(token="theirs")
    Drainer(RegionOutbox).unreserve(reservation.token, reservation.shards)
    assert list(ShardLease.objects.values_list("token", flat=True)) == ["theirs"]
