"""Rows held until commit (OUTBOX_DEFER_WRITES, or outbox_context(defer=True)): written
once, in save order, only if their transaction and savepoints survive, and with the
COMMIT in one round trip on PostgreSQL."""

import contextvars
import gc
import threading
import weakref

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing


@pytest.fixture(autouse=True)
def deferred_writes(settings):
    """The deferred writer is opt-in: these tests turn it on for every context."""
    settings.OUTBOX_DEFER_WRITES = True


def payloads() -> list[object]:
    return list(RegionOutbox.objects.order_by("id").values_list("payload", flat=True))


def test_rows_are_written_as_the_block_commits():
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1})
        assert row.pk is None
        assert not RegionOutbox.objects.exists()
    assert row.pk is not None
    assert RegionOutbox.objects.get().pk == row.pk
    assert row.date_added is not None  # the database default is read back on access
    assert not connection.in_atomic_block


def test_order_of_saves_is_kept_across_savepoints_and_bulk_create(calls):
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(object_identifier=7, payload={"v": 1})
        with transaction.atomic():
            RegionOutboxFactory(object_identifier=7, payload={"v": 2})
        RegionOutbox.objects.bulk_create(
            [RegionOutboxFactory.build(object_identifier=7, payload={"v": 3})]
        )
        RegionOutboxFactory(object_identifier=7, payload={"v": 4})
    assert payloads() == [{"v": 1}, {"v": 2}, {"v": 3}, {"v": 4}]
    drain_outboxes()
    assert calls.payloads() == [{"v": 4}]


def test_rows_of_a_rolled_back_savepoint_are_not_written():
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(payload={"v": "before"})
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            RegionOutboxFactory(payload={"v": "inner"})
            with transaction.atomic():  # released, then undone with its parent
                RegionOutboxFactory(payload={"v": "innermost"})
            raise ZeroDivisionError
        with transaction.atomic():
            RegionOutboxFactory(payload={"v": "kept savepoint"})
        RegionOutboxFactory(payload={"v": "after"})
    assert payloads() == [{"v": "before"}, {"v": "kept savepoint"}, {"v": "after"}]


def test_a_row_saved_again_after_its_savepoint_rolled_back_is_written():
    with outbox_context(transaction.atomic(), flush=False):
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            row = RegionOutboxFactory(payload={"v": "first try"})
            raise ZeroDivisionError
        row.payload = {"v": "second try"}
        row.save()
    assert payloads() == [{"v": "second try"}]


def test_rollback_writes_nothing_and_the_row_can_be_saved_again():
    with pytest.raises(ZeroDivisionError), outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1})
        raise ZeroDivisionError
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(payload={"v": 2})
        transaction.set_rollback(True)
    assert not RegionOutbox.objects.exists()
    with outbox_context(transaction.atomic(), flush=False):
        row.save()
    assert payloads() == [{"v": 1}]


def test_a_row_saved_twice_is_written_once_as_it_was_last():
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1})
        row.payload = {"v": 2}
        row.save()
    assert payloads() == [{"v": 2}]


def test_a_row_changed_after_save_is_written_as_it_was_saved():
    # A direct INSERT would have written it at save(); holding the row must not let a
    # later change (never validated) slip into the table.
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(object_identifier=1, payload={"v": 1, "items": [1]})
        row.payload["items"].append(float("nan"))  # would not even be valid JSON
        row.payload["v"] = 2
        row.object_identifier = 2
    assert payloads() == [{"v": 1, "items": [1]}]
    assert RegionOutbox.objects.get().object_identifier == 1


def test_a_second_save_that_rolled_back_leaves_the_first_one_written():
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": "kept"})
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            row.payload = {"v": "rolled back"}
            row.save()
            raise ZeroDivisionError
    assert payloads() == [{"v": "kept"}]


@pytest.mark.parametrize("how", ["nested in a transaction", "setting off"])
def test_rows_are_written_at_once_where_the_context_does_not_own_the_commit(how):
    def write() -> None:
        with outbox_context(transaction.atomic(), flush=False):
            row = RegionOutboxFactory()
            assert row.pk is not None
            assert RegionOutbox.objects.filter(pk=row.pk).exists()

    if how == "setting off":
        with override_settings(OUTBOX_DEFER_WRITES=False):
            write()
    else:
        with transaction.atomic():
            write()
    assert RegionOutbox.objects.count() == 1


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="on SQLite a second connection waits for the block's write lock",
)
def test_a_thread_given_a_copy_of_the_context_writes_at_once_on_its_own_connection():
    """A thread run in a copy of the context (as asgiref's sync_to_async runs one) sees
    the block's outbox_context but has a connection of its own, outside the block's
    transaction: its save INSERTs at once, as Model.save does there, instead of being
    held for a commit that is not its own."""
    saved = {}

    def save_in_thread() -> None:
        try:
            saved["pk"] = RegionOutboxFactory(payload={"from": "thread"}).pk
        finally:
            connections.close_all()

    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(payload={"from": "block"})
        thread = threading.Thread(target=contextvars.copy_context().run, args=(save_in_thread,))
        thread.start()
        thread.join(10)
        assert saved["pk"] is not None
    assert payloads() == [{"from": "thread"}, {"from": "block"}]


def test_each_database_holds_its_own_rows(calls):
    with outbox_context(transaction.atomic(), flush=False):
        region = RegionOutboxFactory()
        with outbox_context(transaction.atomic(using="control"), flush=False):
            control = ControlOutboxFactory()
            assert region.pk is None and control.pk is None
        assert control.pk is not None and region.pk is None
    assert region.pk is not None
    assert ControlOutbox.objects.count() == 1 and RegionOutbox.objects.count() == 1


def test_a_failing_insert_rolls_the_whole_block_back():
    from tests.testapp.models import Organization

    with (
        pytest.raises(DatabaseError),  # IntegrityError, or DataError on MariaDB
        outbox_context(transaction.atomic(), flush=False),
    ):
        Organization.objects.create(name="kept only if the outbox row is")
        RegionOutboxFactory(attempts=-1)  # the database's check constraint refuses it
    assert not Organization.objects.exists()
    assert not RegionOutbox.objects.exists()
    with outbox_context(transaction.atomic(), flush=False):  # the connection still works
        RegionOutboxFactory()
    assert RegionOutbox.objects.count() == 1


@pytest.mark.skipif(
    not settings.TEST_DB.startswith("postgres"), reason="the COMMIT rides along on PostgreSQL"
)
def test_postgresql_sends_the_insert_and_the_commit_together():
    with (
        CaptureQueriesContext(connection) as queries,
        outbox_context(transaction.atomic(), flush=False),
    ):
        RegionOutboxFactory(object_identifier=1)
        RegionOutboxFactory(object_identifier=2)
    statements = [query["sql"] for query in queries.captured_queries]
    assert len(statements) == 3, statements  # BEGIN (psycopg's), INSERT; COMMIT, COMMIT
    assert statements[1].startswith('INSERT INTO "outbox_regionoutbox"')
    assert statements[1].endswith("; COMMIT")
    assert RegionOutbox.objects.count() == 2


def test_pre_save_is_sent_by_save_and_post_save_when_the_row_is_written():
    from django.db.models.signals import post_save, pre_save

    seen: list[tuple[str, object, bool]] = []

    def before(sender, instance, **kwargs):
        seen.append(("pre_save", instance.pk, RegionOutbox.objects.exists()))

    def after(sender, instance, created, **kwargs):
        assert created
        seen.append(("post_save", instance.pk, RegionOutbox.objects.exists()))

    pre_save.connect(before, sender=RegionOutbox)
    post_save.connect(after, sender=RegionOutbox)
    try:
        with outbox_context(transaction.atomic(), flush=False):
            row = RegionOutboxFactory()
            assert seen == [("pre_save", None, False)]
        assert seen == [("pre_save", None, False), ("post_save", row.pk, True)]
    finally:
        pre_save.disconnect(before, sender=RegionOutbox)
        post_save.disconnect(after, sender=RegionOutbox)


def test_the_context_argument_turns_the_deferred_writer_on_and_off(settings):
    settings.OUTBOX_DEFER_WRITES = False
    with outbox_context(transaction.atomic(), flush=False, defer=True):
        held = RegionOutboxFactory()
        assert held.pk is None
    assert held.pk is not None
    settings.OUTBOX_DEFER_WRITES = True
    with outbox_context(transaction.atomic(), flush=False, defer=False):
        direct = RegionOutboxFactory()
        assert direct.pk is not None
    assert RegionOutbox.objects.count() == 2


def test_a_written_row_holds_its_key_and_database_defaults_as_a_saved_row_does():
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1}, delivered_to="kept as given")
    stored = RegionOutbox.objects.get(pk=row.pk)
    fields = ("date_added", "scheduled_for", "scheduled_from", "delivered_to", "last_traceback")
    with CaptureQueriesContext(connection) as queries:
        values = [getattr(row, name) for name in fields]
    assert values == [getattr(stored, name) for name in fields]
    assert values[0].tzinfo is not None
    # The very values a query gives: the same instants with the same tzinfo.
    assert [(v.isoformat(), v.tzinfo) for v in values[:3]] == [
        (getattr(stored, name).isoformat(), getattr(stored, name).tzinfo) for name in fields[:3]
    ]
    assert row.delivered_to == "kept as given"
    if settings.TEST_DB.startswith("postgres"):
        assert not queries.captured_queries  # returned by the INSERT itself
    assert not row._state.adding
    assert row._state.db == "default"
    row.save()  # an UPDATE now, not a second INSERT
    assert RegionOutbox.objects.count() == 1


def test_a_time_given_for_a_column_with_a_database_default_is_read_back_as_stored():
    from zoneinfo import ZoneInfo

    due = timezone.now().astimezone(ZoneInfo("Asia/Tokyo")) + timezone.timedelta(hours=1)
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1}, scheduled_for=due)
    stored = RegionOutbox.objects.get(pk=row.pk)
    for name in ("scheduled_for", "scheduled_from", "date_added"):
        assert getattr(row, name) == getattr(stored, name)
        assert getattr(row, name).tzinfo == getattr(stored, name).tzinfo
    assert row.scheduled_for == due
    assert row.scheduled_from == row.date_added  # both the INSERT's statement time


def test_a_flushed_row_still_holds_its_database_defaults(calls):
    with outbox_context(transaction.atomic()):  # flushed, so deleted, right after commit
        row = RegionOutboxFactory(payload={"v": 1})
    assert calls.payloads() == [{"v": 1}]
    assert not RegionOutbox.objects.exists()
    assert row.date_added is not None and row.scheduled_for is not None


def test_a_row_with_an_expression_for_a_value_is_written_as_bulk_create_writes_it():
    from django.db.models.functions import Now

    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutboxFactory(payload={"v": 1}, scheduled_for=Now())
    stored = RegionOutbox.objects.get()
    assert stored.pk == row.pk
    assert stored.payload == {"v": 1}
    assert stored.scheduled_for <= timezone.now()


def test_payloads_are_stored_as_an_immediate_insert_stores_them():
    odd = {"quote": 'it\'s "x"', "backslash": "a\\b", "text": "é ✓ 😀", "list": [1.5, None, True]}
    with outbox_context(transaction.atomic(), flush=False):
        held = [RegionOutboxFactory(payload=odd), RegionOutboxFactory(payload=None)]
    with outbox_context(transaction.atomic(), flush=False, defer=False):
        direct = [RegionOutboxFactory(payload=odd), RegionOutboxFactory(payload=None)]
    stored = RegionOutbox.objects.in_bulk([row.pk for row in held + direct])
    assert [stored[row.pk].payload for row in held] == [odd, None]
    assert [stored[row.pk].payload for row in direct] == [odd, None]
    # None is SQL NULL either way (not JSON null), as Django stores it.
    assert RegionOutbox.objects.filter(payload__isnull=True).count() == 2


def test_every_kind_of_value_is_stored_as_an_immediate_insert_stores_it():
    """Enum members, negative and big integers, quoted and empty text, explicit times
    and None all round-trip as they do through Model.save."""
    due = timezone.now() + timezone.timedelta(hours=1)
    values = {
        "shard_identifier": -(2**63),
        "object_identifier": 2**63 - 1,
        "scheduled_for": due,
        "attempts": 2,
        "first_attempt_at": None,
        "last_error": "it's a \\ 'quoted' error",
        "last_traceback": "",
    }
    with outbox_context(transaction.atomic(), flush=False):
        held = RegionOutboxFactory(**values)
    with outbox_context(transaction.atomic(), flush=False, defer=False):
        direct = RegionOutboxFactory(**values)
    columns = ["shard_scope", "category", *values]
    rows = RegionOutbox.objects.in_bulk([held.pk, direct.pk])
    stored = [[getattr(rows[pk], name) for name in columns] for pk in (held.pk, direct.pk)]
    assert stored[0] == stored[1]
    assert stored[0][2:] == list(values.values())


def test_writes_go_on_after_the_connection_is_closed_and_after_a_refused_insert():
    """The writer keeps a cursor per driver connection: a new connection gets its own,
    and an INSERT the database refused leaves the next transaction's write intact."""
    with outbox_context(transaction.atomic(), flush=False):
        first = RegionOutboxFactory(payload={"v": 1})
    postgres = connection.vendor == "postgresql"  # where the writer keeps a cursor
    closed = weakref.ref(connection.connection) if postgres else None
    connection.close()
    with outbox_context(transaction.atomic(), flush=False):
        second = RegionOutboxFactory(payload={"v": 2})
    if closed is not None:
        gc.collect()
        assert closed() is None  # nothing the writer keeps holds on to the old connection
    expected = [{"v": 1}, {"v": 2}, {"v": 4}]
    if connection.vendor != "sqlite":  # SQLite cannot add a CHECK to a table
        table = RegionOutbox._meta.db_table
        with connection.cursor() as cursor:
            check = "CHECK (object_identifier <> 999)"
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT outbox_test_refuse {check}")
        try:
            with (
                pytest.raises(DatabaseError),
                outbox_context(transaction.atomic(), flush=False),
            ):
                RegionOutboxFactory(payload={"v": 3}, object_identifier=999)
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT outbox_test_refuse")
    with outbox_context(transaction.atomic(), flush=False):
        third = RegionOutboxFactory(payload={"v": 4})
    assert [first.pk, second.pk, third.pk] == list(
        RegionOutbox.objects.order_by("id").values_list("pk", flat=True)
    )
    assert payloads() == expected
    assert third.date_added.tzinfo is not None
