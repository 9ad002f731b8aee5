"""On PostgreSQL, once a drain finds shards of about one row each, it claims the next
ones by scanning the shard index's rows (`claim_scan`) instead of skipping from shard to
shard; whatever it misses that way (a shard held elsewhere, an expired lease, a shard
of many rows) its walk finds, so nothing due waits."""

from collections import defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from outbox.backends import get_backend
from outbox.backends.postgresql.backend import PostgresBackend
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.statements import statements_by_thread

pytestmark = committing


@pytest.fixture(autouse=True)
def small_batches(settings):
    if not isinstance(get_backend("default"), PostgresBackend):
        pytest.skip("the PostgreSQL fast path's claim")
    settings.OUTBOX_BATCH_SHARDS = 100  # the first batch; then up to 200 small shards
    settings.OUTBOX_BATCH_ROWS = 200


def one_row_shards(shards, **fields):
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=n, payload={"n": n}, **fields) for n in shards]
    )


def scans(seen):
    return [sql for _, sql in seen if "DISTINCT ON" in sql]


def lease_elsewhere(shard, expires_in):
    ShardLease.objects.create(
        outbox=RegionOutbox._meta.label_lower,
        region_name="",
        shard_scope=RegionOutboxFactory.shard_scope,
        shard_identifier=shard,
        token="elsewhere",
        holder="another worker",
        expires_at=timezone.now() + timedelta(seconds=expires_in),
    )


def test_small_shards_around_a_long_one_and_a_dead_head_are_delivered_in_order(calls):
    one_row_shards(range(1000))
    RegionOutbox.objects.bulk_create(  # shard 500: 600 rows more, in order
        [RegionOutboxFactory.build(shard_identifier=500, payload={"i": i}) for i in range(600)]
    )
    dead = RegionOutbox.objects.get(shard_identifier=700)  # shard 700: a dead head
    RegionOutbox.objects.filter(id=dead.id).update(dead_at=timezone.now())
    RegionOutboxFactory(shard_identifier=700, payload={"after": "dead"})
    with statements_by_thread(whole=True) as seen:
        stats = drain_outboxes([RegionOutbox])
    assert scans(seen)  # the claims after the first batch scanned
    assert stats.rows_retired == 1000 + 600
    by_shard = defaultdict(list)
    for call in calls.calls:
        by_shard[call["shard_identifier"]].append(call["payload"])
    assert set(by_shard) == set(range(1000))
    assert by_shard[500] == [{"n": 500}] + [{"i": i} for i in range(600)]
    assert by_shard[700] == [{"after": "dead"}]
    assert list(RegionOutbox.objects.values_list("id", flat=True)) == [dead.id]
    assert not ShardLease.objects.exists()


def test_a_long_shard_held_elsewhere_hides_none_of_the_shards_after_it(calls):
    # The first batch takes shards 0-99; the scan after it sees only shard 100's rows
    # (held by another worker), so it wins nothing; the walk goes on past it.
    one_row_shards(range(100))
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=100) for _ in range(1000)]
    )
    one_row_shards(range(101, 600))
    lease_elsewhere(100, expires_in=60)
    with statements_by_thread(whole=True) as seen:
        stats = drain_outboxes([RegionOutbox])
    assert scans(seen)
    assert stats.rows_retired == 599
    assert sorted(c["shard_identifier"] for c in calls.calls) == [n for n in range(600) if n != 100]
    assert RegionOutbox.objects.filter(shard_identifier=100).count() == 1000
    assert list(ShardLease.objects.values_list("token", flat=True)) == ["elsewhere"]


def test_an_expired_lease_among_small_shards_is_taken_over(calls):
    one_row_shards(range(500))
    lease_elsewhere(300, expires_in=-1)  # its holder died
    with statements_by_thread(whole=True) as seen:
        stats = drain_outboxes([RegionOutbox])
    assert scans(seen)
    assert stats.rows_retired == 500
    assert sorted(c["shard_identifier"] for c in calls.calls) == list(range(500))
    assert not ShardLease.objects.exists() and not RegionOutbox.objects.exists()


@pytest.mark.parametrize("shards", [3000, 6000])
def test_one_message_per_shard_costs_three_statements_a_batch_whatever_the_shards(shards, settings):
    settings.OUTBOX_BATCH_ROWS = 1000
    one_row_shards(range(shards))
    with statements_by_thread() as seen:
        stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == shards
    # Per batch of 1000 shards a claim (on the thread claiming ahead, from the third
    # batch on), a read and a settle (on the settling thread, mostly). Besides: the
    # first batch of 100 shards (3); the last scan finds fewer shards than wanted and
    # goes on with a walk around from the cursor (1); at the end an empty claim made
    # ahead (a scan and a walk around, 2) and the walk around made again after it, the
    # last batch not being full (1). And the drain's first look for back-offs a new
    # message ends (1), and its look at other drains' leases after the empty claim (1).
    assert len(seen) == 9 + 3 * (shards // 1000), seen
    assert any(name.startswith("outbox-claim") for name, _ in seen)
