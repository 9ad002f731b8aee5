"""The Django internals the app relies on (outbox/internals.py).

These fail on a Django version that changes them, before any user sees a held row lost
or written twice.
"""

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from outbox import internals
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing


def test_a_marker_of_a_rolled_back_savepoint_is_no_longer_pending():
    with transaction.atomic():
        assert internals.savepoint_marker(connection) is None  # no savepoint yet
        with transaction.atomic():
            kept = internals.savepoint_marker(connection)
        try:
            with transaction.atomic():
                dropped = internals.savepoint_marker(connection)
                raise ZeroDivisionError
        except ZeroDivisionError:
            pass
        pending = internals.pending_markers(connection)
        assert kept is not None and dropped is not None
        assert id(kept) in pending
        assert id(dropped) not in pending


def test_mark_written_leaves_the_row_as_save_would():
    row = RegionOutboxFactory.build()
    written = RegionOutboxFactory.build(object_identifier=row.object_identifier)
    with transaction.atomic():
        RegionOutbox.objects.bulk_create([written])
    internals.mark_written(row, vars(written), connection.alias)
    assert row.pk == written.pk
    assert row._state.adding is False and row._state.db == connection.alias
    assert row.date_added is not None  # a database default, read back
    row.save()  # an UPDATE now, not a second INSERT
    assert RegionOutbox.objects.count() == 1


def test_live_receivers_gives_the_sync_and_async_receivers_of_a_sender():
    from django.dispatch import Signal

    signal = Signal()

    def first(sender, **kwargs):
        pass

    async def second(sender, **kwargs):
        pass

    signal.connect(first, sender="a")
    signal.connect(second, sender="a")
    signal.connect(first, sender="b")
    assert internals.live_receivers(signal, "a") == ([first], [second])
    assert internals.live_receivers(signal, "c") == ([], [])


def test_has_async_receivers_sees_an_async_receiver_of_any_sender():
    from django.dispatch import Signal

    signal = Signal()

    def sync(sender, **kwargs):
        pass

    async def awaited(sender, **kwargs):
        pass

    assert not internals.has_async_receivers(signal)
    signal.connect(sync, sender="a")
    assert not internals.has_async_receivers(signal)
    signal.connect(awaited, sender="b")
    assert internals.has_async_receivers(signal)
    signal.disconnect(awaited, sender="b")
    assert not internals.has_async_receivers(signal)


def test_a_kept_cursor_is_made_once_per_connection_and_seen_by_execute_wrappers():
    """`kept_cursor` hands out the same driver cursor inside Django's wrapper, whose
    execute wrappers see its statements, and makes a new one after a reconnect."""
    seen: list[str] = []
    database = connections[DEFAULT_DB_ALIAS]  # Django's wrapper itself, not the proxy

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    def make(_driver):
        return database.create_cursor()

    first = internals.kept_cursor(database, "test", make)
    with database.execute_wrapper(wrapper):
        first.execute("SELECT 1")
    assert [tuple(row) for row in first.fetchall()] == [(1,)]
    again = internals.kept_cursor(database, "test", make)
    assert again.cursor is first.cursor
    assert seen == ["SELECT 1"]
    database.close()
    if database.connection is not None:
        return  # SQLite's in-memory test database is kept open by Django's test runner
    reconnected = internals.kept_cursor(database, "test", make)
    assert reconnected.cursor is not first.cursor
    reconnected.execute("SELECT 2")
    assert [tuple(row) for row in reconnected.fetchall()] == [(2,)]
