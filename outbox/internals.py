"""The only Django internals the app relies on, here and nowhere else;
tests/test_django_internals.py fails on a Django version that changes them.

Django has no public way to ask, before COMMIT, whether a savepoint was rolled back,
nor to mark an instance as saved after a bulk insert made on its behalf (both for the
opt-in deferred writer), nor to call a signal's receivers one by one and skip some (for
the engine, which records which receivers succeeded for a failing message).

- A save inside a savepoint registers a no-op on-commit callback as its marker. Django
  drops the callbacks of a savepoint that rolls back (documented); which markers are
  still pending is read from `connection.run_on_commit` (internal).
- `Model._state` (internal) says whether an instance is saved, and to which database.
- How Django turns a column into a value (`connection.ops.get_db_converters`, a field's
  `get_db_converters`, undocumented) for columns read by hand-written SQL.
- `Signal._live_receivers(sender)` (internal) returns the sync and the async receivers
  for a sender, as `send` and `send_robust` use it (stable since Django 5.0).
- A cursor the app keeps per connection for statements it runs over and over
  (`kept_cursor`: made on first use, again after a reconnect) is handed out inside
  Django's own cursor wrapper (`connection.make_cursor`, `make_debug_cursor` and
  `queries_logged`, the database backend API, undocumented for apps), so query logging,
  `CaptureQueriesContext` and execute wrappers see its statements as any other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import NOT_PROVIDED, Model
from django.db.models.expressions import DatabaseDefault
from django.dispatch import Signal

if TYPE_CHECKING:
    from outbox.models import OutboxBase


class SavepointMarker:
    """Registered with on_commit by a save inside a savepoint; still pending at the end
    of the block only if that savepoint (and every enclosing one) was kept."""

    def __call__(self) -> None:
        pass


def savepoint_marker(connection: BaseDatabaseWrapper) -> SavepointMarker | None:
    """A marker for a save made now, or None outside any savepoint."""
    if not connection.savepoint_ids:
        return None
    marker = SavepointMarker()
    connection.on_commit(marker)
    return marker


def pending_markers(connection: BaseDatabaseWrapper) -> set[int]:
    """The ids of the markers whose savepoints were all kept so far."""
    return {id(callback) for _, callback, *_ in connection.run_on_commit}


def mark_written(row: OutboxBase, written: Mapping[str, Any], using: str) -> None:
    """Leave `row` as Django's save would have: its primary key and database set, no
    longer adding. `written` holds what the INSERT returned by attname: the primary key,
    and the database defaults where it returned them (the `vars()` of an instance that
    `bulk_create` saved will do). A database default it did not return is read back
    on first access."""
    row.pk = written[row._meta.pk.attname]
    row._state.adding = False
    row._state.db = using
    values = row.__dict__
    for attname in _database_defaults(type(row)):
        if attname not in values:
            continue
        returned = written.get(attname)
        if returned is not None and not isinstance(returned, DatabaseDefault):
            values[attname] = returned
        elif hasattr(values[attname], "resolve_expression"):
            del values[attname]  # the database chose it: deferred, read on access


@cache
def _database_defaults(model: type[OutboxBase]) -> tuple[str, ...]:
    """The attnames of the fields with a database default."""
    return tuple(f.attname for f in model._meta.concrete_fields if f.db_default is not NOT_PROVIDED)


def live_receivers(
    signal: Signal, sender: object
) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]]]:
    """The sync and the async receivers connected for `sender`, in Django's order."""
    sync_receivers, async_receivers = signal._live_receivers(sender)
    return list(sync_receivers), list(async_receivers)


def has_async_receivers(signal: Signal) -> bool:
    """Whether any `async def` receiver is connected to `signal`, for any sender. Each
    entry of `Signal.receivers` ends with its `is_async` flag (Django 5.0 to 6.0)."""
    return any(entry[-1] for entry in signal.receivers)


Convert = Callable[[Any], Any]


def column_converter(model: type[Model], name: str, connection: BaseDatabaseWrapper) -> Convert:
    """How Django turns column `name` of `model` into a value, as one function: the
    backend's converters, then the field's own (a custom decoder, a time zone)."""
    column = model._meta.get_field(name).get_col(model._meta.db_table)  # type: ignore[union-attr]
    converters = [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
    if not converters:
        return as_is

    def convert(value: Any) -> Any:
        for function in converters:
            value = function(value, column, connection)
        return value

    return convert


def as_is(value: Any) -> Any:
    """The converter of a column Django loads as the driver returns it."""
    return value


# Per Django connection and purpose, the driver connection a cursor was made on and the
# cursor. Keyed by Django's wrapper, not the driver connection: the cursor refers to the
# driver connection, and a weak key its own value keeps alive would never be dropped.
_kept: WeakKeyDictionary[BaseDatabaseWrapper, dict[str, tuple[Any, Any]]] = WeakKeyDictionary()


def kept_cursor(connection: BaseDatabaseWrapper, purpose: str, make: Callable[[Any], Any]) -> Any:
    """The cursor kept for `purpose` on the connection's driver connection, wrapped as
    Django wraps its own; `make(driver_connection)` makes it the first time, and after
    a reconnect or once it is closed. Not to be closed by the caller (no `with`)."""
    connection.ensure_connection()
    driver = connection.connection
    kept = _kept.get(connection)
    if kept is None:
        kept = _kept[connection] = {}
    driver_then, cursor = kept.get(purpose, (None, None))
    # A driver cursor that says it is closed (psycopg's do) is made again.
    if driver_then is not driver or getattr(cursor, "closed", False):
        cursor = make(driver)
        kept[purpose] = (driver, cursor)
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)
