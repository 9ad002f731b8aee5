"""Issue #35 (item 2): `OutboxQuerySet.discard()` must not orphan a shard's lease.

A failed delivery leaves its shard a back-off lease (no holder). No drain claims a shard
without pending rows, so a lease left behind once its rows are discarded is never
removed: it turns expired and `outbox_status --max-expired 0`, the health check and the
dashboard stay red for good. Leases a worker holds right now are left alone."""

from datetime import timedelta

from django.db.models.functions import Now
from django.utils import timezone

from outbox.engine import drain_outboxes
from outbox.health import Thresholds, check, statuses
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing

NOTHING_EXPIRED = Thresholds(max_expired=0)


def back_off(calls, model, *shards):
    """Drain with the receivers of `shards` failing: each of them backs off."""
    calls.failing = set(shards)
    stats = drain_outboxes([model])
    assert stats.failures == len(shards)
    leases = ShardLease.objects.using(model._default_manager.db).of(model)
    assert sorted(leases.backing_off().values_list("shard_identifier", flat=True)) == sorted(shards)
    calls.failing = set()


def back_off_over(model):
    """Skip the back-off (database clock): every lease over, every row due."""
    ShardLease.objects.using(model._default_manager.db).update(expires_at=Now())
    model.objects.pending().update(scheduled_for=Now())


def lease_shards(model):
    leases = ShardLease.objects.using(model._default_manager.db).of(model)
    return sorted(leases.values_list("shard_identifier", flat=True))


def assert_nothing_expired(model):
    [table] = statuses(models=[model])
    assert (table["expired_shards"], table["backing_off_shards"]) == (0, 0)
    assert check(thresholds=NOTHING_EXPIRED) == []


def test_discarding_a_backing_off_message_leaves_no_lease_and_nothing_expired(calls):
    poison = RegionOutboxFactory(shard_identifier=7)
    back_off(calls, RegionOutbox, 7)
    assert RegionOutbox.objects.filter(id=poison.id).discard() == 1
    assert lease_shards(RegionOutbox) == []
    back_off_over(RegionOutbox)
    assert_nothing_expired(RegionOutbox)
    # The shard is free: a new message there is delivered at once.
    RegionOutboxFactory(shard_identifier=7, payload={"v": "next"})
    assert drain_outboxes([RegionOutbox]).receiver_calls == 1
    assert calls.payloads() == [{"v": "next"}]
    assert lease_shards(RegionOutbox) == []


def test_a_row_discarded_on_its_own_takes_its_shards_back_off_too(calls):
    poison = RegionOutboxFactory(shard_identifier=8)
    back_off(calls, RegionOutbox, 8)
    RegionOutbox.objects.get(id=poison.id).discard()
    assert not RegionOutbox.objects.exists()
    assert lease_shards(RegionOutbox) == []


def test_the_control_table_whose_shards_name_a_region(calls):
    ControlOutboxFactory(region_name="eu", shard_identifier=3)
    ControlOutboxFactory(region_name="us", shard_identifier=3)
    back_off(calls, ControlOutbox, 3, 3)
    assert ControlOutbox.objects.filter(region_name="eu").discard() == 1
    leases = ShardLease.objects.using("control").of(ControlOutbox)
    assert list(leases.values_list("region_name", flat=True)) == ["us"]
    assert ControlOutbox.objects.discard() == 1
    assert not leases.exists()
    assert_nothing_expired(ControlOutbox)


def test_a_shard_with_pending_rows_left_keeps_its_back_off_and_dead_letters_do_not(calls):
    failing = RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    behind = RegionOutboxFactory(shard_identifier=1, object_identifier=2)
    RegionOutboxFactory(shard_identifier=2)
    back_off(calls, RegionOutbox, 1, 2)
    assert RegionOutbox.objects.filter(id=failing.id).discard() == 1
    # Shard 1 still has a row: its back-off stands, and a drain takes it from there.
    assert lease_shards(RegionOutbox) == [1, 2]
    back_off_over(RegionOutbox)
    assert drain_outboxes([RegionOutbox]).receiver_calls == 2
    assert lease_shards(RegionOutbox) == []
    assert behind.id not in RegionOutbox.objects.values_list("id", flat=True)
    # A shard left with only a dead letter has nothing a drain would claim.
    dead, discarded = RegionOutboxFactory.create_batch(2, shard_identifier=4)
    back_off(calls, RegionOutbox, 4)
    RegionOutbox.objects.filter(id=dead.id).update(dead_at=timezone.now())
    assert RegionOutbox.objects.filter(id=discarded.id).discard() == 1
    assert lease_shards(RegionOutbox) == []
    assert RegionOutbox.objects.dead().get().id == dead.id


def test_a_lease_a_worker_holds_is_left_alone_and_other_shards_keep_theirs(calls):
    other = RegionOutboxFactory(shard_identifier=8)
    back_off(calls, RegionOutbox, 8)
    held, dead_workers = (RegionOutboxFactory(shard_identifier=n) for n in (5, 6))
    now = timezone.now()
    for shard, token, expires_at in ((5, "live", 5), (6, "gone", -5)):
        ShardLease.objects.create(
            outbox="outbox.regionoutbox",
            shard_scope=held.shard_scope,
            shard_identifier=shard,
            token=token,
            holder=f"{token}:1",
            expires_at=now + timedelta(minutes=expires_at),
        )
    assert RegionOutbox.objects.filter(id__in=[held.id, dead_workers.id]).discard() == 2
    # The live holder settles its shard itself; a dead worker's lease goes with its rows.
    leases = ShardLease.objects.order_by("shard_identifier")
    assert list(leases.values_list("shard_identifier", "token")) == [
        (5, "live"),
        (8, None),
    ]
    assert RegionOutbox.objects.get().id == other.id
