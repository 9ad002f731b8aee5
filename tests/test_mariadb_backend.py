"""The MariaDB fast path (`outbox.backends.mariadb`), beyond the shared contract tests.

Runs on the MariaDB leg only (10.6 or later): statements per batch, shards read apart,
takeover, lost leases, region collations, isolation levels, and real concurrency.
"""

import itertools
import json
import threading
import time
from collections import defaultdict
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import outbox.backends.mariadb.backend as mariadb
import outbox.backends.mariadb.backend as mariadb_backend
from outbox.backends.base import FailedGroup, Lease, Settlement, ShardFilter, decode_json
from outbox.backends.mariadb.backend import MariaDBBackend
from outbox.backends.select import get_backend
from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.shards import ShardKey
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.statements import statements_by_thread
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Delivery

pytestmark = [
    committing,
    pytest.mark.skipif(django_settings.TEST_DB != "mariadb", reason="MariaDB only"),
]


@pytest.fixture(autouse=True)
def fast_path(settings):
    if not MariaDBBackend.supports(connection):
        pytest.skip("MariaDB before 10.6 takes the portable path")
    settings.OUTBOX_FAST_PATH = True
    assert isinstance(get_backend("default"), MariaDBBackend)


def key(identifier, scope=Scope.ORGANIZATION, region=""):
    return ShardKey(region, int(scope), identifier)


def single_message_shards(count):
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=shard) for shard in range(count)]
    )


@pytest.mark.parametrize("shards", [500, 5000])
def test_single_message_shards_cost_five_statements_per_batch(shards, settings):
    settings.OUTBOX_BATCH_SHARDS = 100
    settings.OUTBOX_BATCH_ROWS = 2000
    single_message_shards(shards)
    with statements_by_thread() as captured:  # a backlog's settles run on a thread
        stats = drain_outboxes([RegionOutbox])
    assert (stats.rows_retired, stats.shards) == (shards, shards)
    statements = [sql for _, sql in captured]
    # The first batch claims 100 shards, finds them single-message, and the next ones
    # claim up to BATCH_ROWS (2000) shards each; on a loaded machine the drain's pace
    # (outbox.engine.drain) may cut a batch shorter in time, so count the batches made.
    fewest = 1 + -(-(shards - 100) // 2000)
    kinds = {kind: statements.count(kind) for kind in ("INSERT", "DELETE", "UPDATE")}
    batches = kinds["INSERT"]  # one lease INSERT per batch
    assert fewest <= batches <= 2 * fewest + 1, statements
    # Per batch: walk, lease (INSERT), read (SELECT), delete rows, release (DELETEs);
    # a walk that reaches the end of the key space wraps around once more; the empty
    # claim that ends the drain walks twice. Nothing per shard, nothing updated.
    assert kinds == {"INSERT": batches, "DELETE": 2 * batches, "UPDATE": 0}, statements
    # + 1: the drain's first look for back-offs a new message ends.
    assert batches * 5 <= len(statements) <= batches * 6 + 3, statements


def test_a_window_reads_shards_whole_while_they_fit_and_caps_the_bigger_ones(settings):
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=1, object_identifier=n) for n in range(300)]
    )
    big = list(RegionOutbox.objects.order_by("id"))
    for shard in (2, 3, 4):
        RegionOutboxFactory(shard_identifier=shard)
    backend = MariaDBBackend("default")
    shards = [key(1), key(2), key(3), key(4)]
    # 100 rows a shard, 400 in all: 303 rows fit, so every shard is read to its end.
    window = backend.read_window(RegionOutbox, shards, 100)
    assert len(window.shards[key(1)]) == 300 and window.incomplete == set()
    RegionOutbox.objects.bulk_create(
        [RegionOutboxFactory.build(shard_identifier=1, object_identifier=n) for n in range(200)]
    )
    # 503 rows do not: the big shard is read apart, up to its share, in order.
    window = backend.read_window(RegionOutbox, shards, 100)
    read = [group.row_ids[0] for group in window.shards[key(1)]]
    assert read == [row.id for row in big[:100]]
    assert window.incomplete == {key(1)}
    assert all(len(window.shards[key(shard)]) == 1 for shard in (2, 3, 4))
    # A row not due yet cuts the big shard there: read to its end for now.
    RegionOutbox.objects.filter(id=big[50].id).update(
        scheduled_for=timezone.now() + timedelta(hours=1)
    )
    window = backend.read_window(RegionOutbox, shards, 100)
    assert len(window.shards[key(1)]) == 50 and window.incomplete == set()


def test_shards_read_apart_beyond_the_cap_wait_for_the_next_window(calls, settings, monkeypatch):
    monkeypatch.setattr(mariadb, "MAX_ARMS", 2)
    settings.OUTBOX_BATCH_ROWS = 30
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=shard * 1000 + n)
            for n in range(120)
            for shard in range(1, 6)
        ]
    )
    shards = [key(shard) for shard in range(1, 6)]
    window = MariaDBBackend("default").read_window(RegionOutbox, shards, 30)  # 100 a shard
    assert set(window.shards) == {key(1), key(2)} and window.incomplete == set(shards)
    assert [len(window.shards[key(shard)]) for shard in (1, 2)] == [100, 100]
    stats = drain_outboxes([RegionOutbox])
    assert stats.rows_retired == 600
    for shard in range(1, 6):
        delivered = [c["object_identifier"] for c in calls.calls if c["shard_identifier"] == shard]
        assert delivered == [shard * 1000 + n for n in range(120)]


def test_an_expired_lease_is_taken_over_and_a_live_one_left_alone():
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    past, future = timezone.now() - timedelta(seconds=5), timezone.now() + timedelta(hours=1)
    for shard, expires in ((1, past), (2, future)):
        ShardLease.objects.create(
            outbox="outbox.regionoutbox",
            shard_scope=int(Scope.ORGANIZATION),
            shard_identifier=shard,
            token=f"old{shard}",
            holder="gone",
            expires_at=expires,
        )
    mine = Lease("mine", "me", 60.0)
    assert MariaDBBackend("default").claim(RegionOutbox, mine, ShardFilter(), 10) == [key(1)]
    taken = ShardLease.objects.get(shard_identifier=1)
    assert (taken.token, taken.holder) == ("mine", "me")
    assert taken.expires_at > timezone.now() + timedelta(seconds=50)
    left = ShardLease.objects.get(shard_identifier=2)
    assert (left.token, left.holder, left.expires_at) == ("old2", "gone", future)


def test_settle_deletes_the_rows_of_held_shards_and_reports_the_lost_one():
    kept = RegionOutboxFactory(shard_identifier=1)
    taken = RegionOutboxFactory(shard_identifier=2)
    backend = MariaDBBackend("default")
    mine = Lease("mine", "me", 60.0)
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    ShardLease.objects.of_shard(key(2)).update(token="theirs")
    delivered = {key(1): [kept.id], key(2): [taken.id]}
    settled = backend.settle(
        RegionOutbox, mine, Settlement(delivered=delivered, release=[key(1), key(2)])
    )
    assert (settled.deleted, settled.lost) == (1, frozenset({key(2)}))
    assert list(RegionOutbox.objects.values_list("id", flat=True)) == [taken.id]
    assert list(ShardLease.objects.values_list("token", flat=True)) == ["theirs"]


def test_failures_go_in_documents_of_bounded_size(monkeypatch):
    """The failures of a wide batch, each with a traceback of up to 24 kB, would overflow
    max_allowed_packet in one statement: they are recorded in chunks."""
    monkeypatch.setattr(mariadb_backend, "DOCUMENT_CHARS", 100)
    rows = {
        shard: [RegionOutboxFactory(shard_identifier=shard, object_identifier=7) for _ in (1, 2)]
        for shard in (1, 2, 3)
    }
    backend = MariaDBBackend("default")
    mine = Lease("mine", "me", 60.0)
    backend.claim(RegionOutbox, mine, ShardFilter(), 10)
    failures = [
        FailedGroup(
            key(shard), {row.id: 30.0 for row in group}, f"e{shard}", 30.0, "tb" * 50, "[1]"
        )
        for shard, group in rows.items()
    ]
    with CaptureQueriesContext(connection) as captured:
        backend.settle(RegionOutbox, mine, Settlement(failed=failures))
    updates = [
        q["sql"] for q in captured.captured_queries if q["sql"].lstrip().startswith("UPDATE")
    ]
    assert len(updates) == 4  # three chunks of failures, one back-off
    for shard, group in rows.items():
        older, newest = (RegionOutbox.objects.get(id=row.id) for row in group)
        assert (older.attempts, newest.attempts) == (1, 1)
        assert older.last_error == f"e{shard}" and newest.last_traceback == "tb" * 50
        assert (older.delivered_to, newest.delivered_to) == ("", "[1]")
    assert ShardLease.objects.backing_off().count() == 3


def test_control_shards_claim_after_a_cursor_and_wrap_around():
    for region in ("eu", "us", "ap"):
        for shard in (1, 2):
            ControlOutboxFactory(region_name=region, shard_identifier=shard)
    backend = MariaDBBackend("control")
    mine = Lease("mine", "me", 60.0)
    after = key(1, Scope.USER, "eu")
    won = backend.claim(ControlOutbox, mine, ShardFilter(after=after), 4)
    # After ("eu", 1) in key order: ("eu", 2), ("us", 1), ("us", 2), then ("ap", 1).
    expected = [(2, "eu"), (1, "us"), (2, "us"), (1, "ap")]
    assert won == sorted(key(shard, Scope.USER, region) for shard, region in expected)


def column_collation(alias, table):
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
            " DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'region_name'",
            [table],
        )
        return cursor.fetchone()[0]


def set_collation(alias, table, collation):
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE `{table}` MODIFY `region_name` VARCHAR(48) CHARACTER SET utf8mb4"
            f" COLLATE {collation} NOT NULL"
        )


@pytest.mark.parametrize("lease_collation", ["utf8mb4_unicode_ci", None])
def test_region_names_meet_the_columns_in_their_own_collation(calls, lease_collation):
    """A database created with another collation than the connection's (and a lease
    table whose collation differs from the outbox's) still claims, reads and settles."""
    tables = {ControlOutbox._meta.db_table: "utf8mb4_unicode_ci"}
    if lease_collation:
        tables[ShardLease._meta.db_table] = lease_collation
    saved = {table: column_collation("control", table) for table in tables}
    try:
        for table, collation in tables.items():
            set_collation("control", table, collation)
        mariadb._regions.clear()
        for region in ("eu", "US", "ü"):
            ControlOutboxFactory(region_name=region, shard_identifier=1, payload={"r": region})
        stats = drain_outboxes([ControlOutbox])
        assert (stats.shards, stats.rows_retired) == (3, 3)
        assert sorted(c["payload"]["r"] for c in calls.calls) == ["US", "eu", "ü"]
        assert not ShardLease.objects.using("control").exists()
    finally:
        for table, collation in saved.items():
            set_collation("control", table, collation)
        mariadb._regions.clear()


def test_repeatable_read_connections_drain_alike(calls):
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        single_message_shards(50)
        for n in range(5):
            RegionOutboxFactory(shard_identifier=1000, object_identifier=n)
        assert drain_outboxes([RegionOutbox]).rows_retired == 55
    finally:
        connection.close()  # the next connection has Django's own isolation level


def test_extreme_shard_identifiers_travel_through_json(calls):
    for identifier in (-(2**63), 2**63 - 1, 0):
        RegionOutboxFactory(shard_identifier=identifier, payload={"i": str(identifier)})
    assert drain_outboxes([RegionOutbox]).rows_retired == 3
    assert sorted(int(c["payload"]["i"]) for c in calls.calls) == [-(2**63), 0, 2**63 - 1]


# -- concurrency ----------------------------------------------------------------------


def run_threads(target, count):
    errors = []

    def wrapped(index):
        try:
            target(index)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrapped, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)


def test_claimers_racing_for_the_same_shards_win_each_once():
    single_message_shards(300)
    ShardLease.objects.create(  # an expired lease: taken over by exactly one claimer
        outbox="outbox.regionoutbox",
        shard_scope=int(Scope.ORGANIZATION),
        shard_identifier=7,
        token="dead",
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    start = threading.Barrier(4)
    won = {}

    def claim(index):
        lease = Lease(f"claimer{index}", f"t{index}", 60.0)
        start.wait(10)
        won[index] = MariaDBBackend("default").claim(RegionOutbox, lease, ShardFilter(), 300)

    run_threads(claim, 4)
    claimed = [shard for shards in won.values() for shard in shards]
    assert len(claimed) == len(set(claimed)) == 300
    held = ShardLease.objects.values_list("shard_identifier", "token")
    assert {shard: token for shard, token in held} == {
        shard.shard_identifier: f"claimer{index}"
        for index, shards in won.items()
        for shard in shards
    }


def test_three_drainers_on_wide_batches_deliver_each_row_once_in_order(
    calls, settings, monkeypatch
):
    settings.OUTBOX_BATCH_SHARDS = 20
    settings.OUTBOX_BATCH_ROWS = 100
    monkeypatch.setattr(mariadb, "WINDOW_ROWS", 100)  # 5 rows a shard in wide batches
    calls.journal = True
    single_message_shards(600)  # shards 0..599: one message each
    # And some streams longer than a whole window (100 rows for a shard claimed alone), so
    # that they are read apart in whatever batches the racing drains claim them.
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=shard, object_identifier=shard * 1000 + n)
            for n in range(120)
            for shard in range(1000, 1005)
        ]
    )
    read_apart = []
    read_shares = MariaDBBackend._read_shares

    def counting(self, *args):
        rows, big = read_shares(self, *args)
        read_apart.extend(big)
        return rows, big

    monkeypatch.setattr(MariaDBBackend, "_read_shares", counting)

    def drain(index):
        deadline = time.monotonic() + 60
        while RegionOutbox.objects.exists():
            assert time.monotonic() < deadline, "backlog did not drain"
            if not drain_outboxes([RegionOutbox]).shards:
                time.sleep(0.01)  # the others hold what is left

    run_threads(drain, 3)
    by_shard = defaultdict(list)
    for delivery in Delivery.objects.order_by("started"):
        by_shard[delivery.shard_identifier].append(delivery)
    assert sum(len(d) for d in by_shard.values()) == 1200  # each row exactly once
    assert read_apart  # the streams were read apart at least once
    for shard, deliveries in by_shard.items():
        for previous, current in itertools.pairwise(deliveries):
            assert current.started >= previous.ended, f"receivers of shard {shard} overlapped"
        objects = [d.object_identifier for d in deliveries]
        assert objects == sorted(objects), f"shard {shard} delivered out of order"
    assert len({d.thread for d in Delivery.objects.all()}) > 1  # more than one worked
    assert not ShardLease.objects.exists()
    assert all(c["category"] == Category.AUDIT_EVENT for c in calls.calls)


def test_payload_text_written_by_hand_with_whitespace_is_read_as_django_reads_it(calls):
    """Django writes JSON without whitespace around it and the read skips json.loads'
    whitespace scans for it; text with spaces around it, written by hand, still decodes."""
    for identifier, text in [(1, '{"v": 1}'), (2, '  {"v": 2}'), (3, "[3, 3]\n "), (4, " null ")]:
        RegionOutboxFactory(shard_identifier=identifier, object_identifier=identifier)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {RegionOutbox._meta.db_table} SET payload = %s"
                " WHERE shard_identifier = %s",
                [text, identifier],
            )
    drain_outboxes()
    assert sorted(calls.payloads(), key=repr) == sorted(
        [{"v": 1}, {"v": 2}, [3, 3], None], key=repr
    )
    with pytest.raises(json.JSONDecodeError):
        decode_json('[1] "trailing text"')
