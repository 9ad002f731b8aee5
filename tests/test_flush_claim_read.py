"""A synchronous flush claims its shards and reads them in one statement on PostgreSQL;
the read must still see what another worker committed after the statement began."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox.backends import get_backend
from outbox.backends.postgresql.backend import PostgresBackend
from outbox.engine import Drainer
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = [
    committing,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the one-statement flush is PostgreSQL's"
    ),
]


def fast_path():
    if not isinstance(get_backend("default"), PostgresBackend):
        pytest.skip("the portable path claims and reads in steps")


def engine_statements(captured):
    # Leaving out transaction control, and the isolation level asked once per connection.
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"] not in ("BEGIN", "COMMIT") and not q["sql"].startswith("SHOW ")
    ]


def test_a_flush_claims_and_reads_in_one_statement_then_settles(calls):
    fast_path()
    rows = [RegionOutboxFactory(shard_identifier=n, object_identifier=n) for n in (1, 2)]
    bounds = {row.shard_key: row.id for row in rows}
    with CaptureQueriesContext(connection) as captured:
        stats = Drainer(RegionOutbox).flush(bounds)
    assert (stats.shards, stats.rows_retired) == (2, 2)
    assert sorted(c["object_identifier"] for c in calls.calls) == [1, 2]
    # One statement claims and reads both shards, one settles (deletes and releases).
    assert len(engine_statements(captured)) == 2, engine_statements(captured)
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_a_flush_skips_a_shard_held_by_another_worker(calls):
    fast_path()
    row = RegionOutboxFactory(shard_identifier=1)
    lease_row(row.shard_key, token="theirs", expires_at=timezone.now() + timedelta(minutes=1))
    stats = Drainer(RegionOutbox).flush({row.shard_key: row.id})
    assert (stats.shards, calls.calls) == (0, [])
    assert RegionOutbox.objects.filter(pk=row.pk).exists()


def lease_row(key, token, expires_at):
    return ShardLease.objects.create(
        outbox=RegionOutbox._meta.label_lower,
        region_name=key.region_name,
        shard_scope=key.shard_scope,
        shard_identifier=key.shard_identifier,
        token=token,
        holder="another worker",
        expires_at=expires_at,
    )


def flush_while_another_worker_holds(row, hold):
    """Flush `row`'s shard while another worker, on its own connection, has run `hold`
    in a transaction it has not committed yet; that worker commits once the flush waits
    for one of its locks. Returns the flush's stats (the flush must not raise)."""
    holding, commit = threading.Event(), threading.Event()
    outcome = {}

    def other_worker():
        try:
            with transaction.atomic():
                hold()
                holding.set()
                assert commit.wait(10)
        finally:
            connections.close_all()

    def flush():
        try:
            outcome["stats"] = Drainer(RegionOutbox).flush({row.shard_key: row.id})
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    worker = threading.Thread(target=other_worker)
    worker.start()
    assert holding.wait(10)
    flusher = threading.Thread(target=flush)
    flusher.start()
    try:
        wait_for_a_lock_wait()
    finally:
        commit.set()
        worker.join(10)
        flusher.join(10)
    assert "error" not in outcome, outcome
    return outcome["stats"]


def test_a_flush_takes_over_an_expired_lease(calls):
    fast_path()
    row = RegionOutboxFactory(shard_identifier=1)
    lease_row(row.shard_key, token="theirs", expires_at=timezone.now() - timedelta(seconds=1))
    stats = Drainer(RegionOutbox).flush({row.shard_key: row.id})
    assert (stats.shards, stats.rows_retired) == (1, 1)
    assert [call["object_identifier"] for call in calls.calls] == [row.object_identifier]
    assert not ShardLease.objects.exists()


def test_a_flush_waits_for_an_expired_lease_being_renewed_and_leaves_it(calls):
    """The lease looked expired when the flush's statement began, but its holder is
    renewing it: the flush waits for that, sees the renewed lease and does not take it
    (two holders of one shard would deliver out of order)."""
    fast_path()
    row = RegionOutboxFactory(shard_identifier=1)
    lease = lease_row(row.shard_key, token="theirs", expires_at=timezone.now() - timedelta(1))

    def renew():
        ShardLease.objects.filter(pk=lease.pk).update(
            expires_at=timezone.now() + timedelta(minutes=1)
        )

    stats = flush_while_another_worker_holds(row, renew)
    assert (stats.shards, calls.calls) == (0, [])
    assert ShardLease.objects.get().token == "theirs"
    assert RegionOutbox.objects.filter(pk=row.pk).exists()


def wait_for_a_lock_wait(timeout=10.0):
    """Until some session of this database waits for a lock (our flush)."""
    deadline = time.monotonic() + timeout
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the flush never waited for the other worker")


@pytest.mark.parametrize("settled_as", ["delivered", "dead"])
def test_a_row_settled_by_a_worker_that_let_go_while_the_flush_ran_is_not_read(calls, settled_as):
    """Another worker whose lease lapsed (still its holder: nobody took it over) settles
    the shard's only row and releases the shard. Its settle is under way when the
    flush's statement begins, so that statement's snapshot still shows the row, and it
    commits while the flush waits to insert its lease. The flush then wins the shard;
    it must not deliver the row the other worker delivered, or gave up as dead."""
    fast_path()
    row = RegionOutboxFactory(shard_identifier=1)
    lease = lease_row(row.shard_key, token="theirs", expires_at=timezone.now() - timedelta(1))

    def settle():
        with connections["default"].cursor() as cursor:
            ShardLease.objects.select_for_update().get(pk=lease.pk)
            if settled_as == "delivered":
                RegionOutbox.objects.filter(pk=row.pk).delete()
            else:
                RegionOutbox.objects.filter(pk=row.pk).update(dead_at=timezone.now())
            cursor.execute(f"DELETE FROM {ShardLease._meta.db_table} WHERE id = %s", [lease.pk])

    stats = flush_while_another_worker_holds(row, settle)
    assert stats.shards == 1  # it won the shard, the other worker having let go
    assert calls.calls == []
    assert not ShardLease.objects.exists()


@pytest.mark.parametrize("set_by", ["django", "server"])
def test_under_repeatable_read_a_flush_claims_then_reads(calls, set_by):
    """The one-statement read relies on READ COMMITTED's re-check of locked rows; under
    another isolation level (Django's option, or the server's default for statements
    outside a transaction) the flush takes two statements, and still delivers."""
    fast_path()
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    row = RegionOutboxFactory(shard_identifier=1)
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    connection.close()
    if set_by == "django":
        options["isolation_level"] = IsolationLevel.REPEATABLE_READ
    else:
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_isolation = 'repeatable read'")
    try:
        with CaptureQueriesContext(connection) as captured:
            stats = Drainer(RegionOutbox).flush({row.shard_key: row.id})
    finally:
        options.clear()
        options.update(saved)
        connection.close()
    assert (stats.shards, stats.rows_retired) == (1, 1)
    assert len(calls.calls) == 1
    # Claim, read, settle.
    assert len(engine_statements(captured)) == 3, engine_statements(captured)


@pytest.mark.parametrize("threshold", [None, 0])
def test_where_the_connection_prepares_statements_a_flush_claim_is_planned_once(calls, threshold):
    """psycopg prepares statements on a connection whose OPTIONS set `prepare_threshold`
    (Django leaves it None, for connection poolers). There the engine's statements are
    prepared, and the claim of a one-shard flush gets a generic plan, made once instead
    of at every flush (planning that statement costs more than running it). Statements
    with array parameters (the settle, a drain's claim and read) are never prepared: a
    generic plan made for small flushes would serve a drain's batch of thousands of
    shards too, 100 times slower. Without the option, nothing is prepared."""
    fast_path()
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    connection.close()  # a new session, without the statements of earlier tests
    options["prepare_threshold"] = threshold
    try:
        for n in range(8):
            row = RegionOutboxFactory(shard_identifier=1, object_identifier=n)
            stats = Drainer(RegionOutbox).flush({row.shard_key: row.id})
            assert (stats.shards, stats.rows_retired) == (1, 1)
        for n in range(8):  # drains: a batch of two shards, each of its statements 8 times
            RegionOutboxFactory(shard_identifier=2, object_identifier=n)
            RegionOutboxFactory(shard_identifier=3, object_identifier=n)
            assert Drainer(RegionOutbox).drain().rows_retired == 2
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement, generic_plans FROM pg_prepared_statements")
            prepared = cursor.fetchall()
    finally:
        options.clear()
        options.update(saved)
        connection.close()
    assert [call["object_identifier"] for call in calls.calls][:8] == list(range(8))
    if threshold is None:
        assert prepared == []
    else:
        claims = [plans for sql, plans in prepared if "VALUES($" in sql.replace(" ", "")]
        # Eight flushes: PostgreSQL plans the first five, then keeps a generic plan.
        assert len(claims) == 1 and claims[0] >= 2, prepared
        assert not [sql for sql, _ in prepared if "[]" in sql], prepared
