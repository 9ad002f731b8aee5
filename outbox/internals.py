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
- `Signal._live_receivers(sender)` (internal) returns the sync and the async receivers
  for a sender, as `send` and `send_robust` use it (stable since Django 5.0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import NOT_PROVIDED
from django.db.models.expressions import DatabaseDefault
from django.dispatch import Signal

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


def live_receivers(
    signal: Signal, sender: object
) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]]]:
    """The sync and the async receivers connected for `sender`, in Django's order."""
    sync_receivers, async_receivers = signal._live_receivers(sender)
    return list(sync_receivers), list(async_receivers)
