"""The only Django internals the app relies on, all for the opt-in deferred writer.

Django has no public way to ask, before COMMIT, whether a savepoint was rolled back,
nor to mark an instance as saved after a bulk insert made on its behalf. Both are done
here and nowhere else; tests/test_django_internals.py fails on a Django version that
changes them.

- A save inside a savepoint registers a no-op on-commit callback as its marker. Django
  drops the callbacks of a savepoint that rolls back (documented); which markers are
  still pending is read from `connection.run_on_commit` (internal).
- `Model._state` (internal) says whether an instance is saved, and to which database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.models import NOT_PROVIDED
from django.db.models.expressions import DatabaseDefault

if TYPE_CHECKING:
    from outbox.models import OutboxBase


class SavepointMarker:
    """Registered with on_commit by a save inside a savepoint; still pending at the end
    of the block only if that savepoint (and every enclosing one) was kept."""

    def __call__(self) -> None:
        pass


def savepoint_marker(using: str) -> SavepointMarker | None:
    """A marker for a save made now, or None outside any savepoint."""
    if not connections[using].savepoint_ids:
        return None
    marker = SavepointMarker()
    transaction.on_commit(marker, using=using)
    return marker


def pending_markers(using: str) -> set[int]:
    """The ids of the markers whose savepoints were all kept so far."""
    return {id(callback) for _, callback, *_ in connections[using].run_on_commit}


def mark_written(row: OutboxBase, written: OutboxBase, using: str) -> None:
    """Leave `row` as Django's save would have: its primary key and database set, no
    longer adding, database defaults as returned (or reloaded on access)."""
    row.pk = written.pk
    row._state.adding = False
    row._state.db = using
    values = row.__dict__
    for field in row._meta.concrete_fields:
        if field.db_default is not NOT_PROVIDED and field.attname in values:
            returned = written.__dict__.get(field.attname)
            if returned is None or isinstance(returned, DatabaseDefault):
                del values[field.attname]  # deferred: read back on first access
            else:
                values[field.attname] = returned
