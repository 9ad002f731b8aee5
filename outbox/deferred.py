"""Outbox rows held back until their transaction commits (OUTBOX_DEFER_WRITES).

An `outbox_context(transaction.atomic())` whose atomic opens the outermost transaction
of its database owns that transaction's end. Outbox rows saved on that database inside
it (at any depth, nested atomics included) are not INSERTed by `save()`: they are held
here and written together as the block ends, just before its COMMIT, in one statement
per table. On PostgreSQL with psycopg 3 and client-side binding (Django's default) the
COMMIT travels in the same round trip, so the outbox rows of a transaction cost the
database work of their INSERT but no round trip of their own.

Rows saved inside a savepoint that later rolls back must not be written. Django drops
the on-commit callbacks registered inside a savepoint when it rolls back, so each
savepoint-level save registers a no-op callback as its marker, and only rows whose
marker survived are written.

Each save takes the row's INSERT parameters when it happens (pre_save is sent then), so
a row is written as it was at its last save that survived, as a direct INSERT would
have written it. Until the block ends a held row has no primary key and queries inside
the block do not see it; post_save is sent when it is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.transaction import Atomic

from outbox import insert
from outbox.conf import outbox_settings

if TYPE_CHECKING:
    from collections.abc import Sequence

    from outbox.models import OutboxBase


class _SavepointMarker:
    """Registered with on_commit by a save inside a savepoint; present at the end of
    the block only if that savepoint (and every enclosing one) was kept."""

    def __call__(self) -> None:
        pass


@dataclass
class _Entry:
    frame: Any
    # Each save of the row: its savepoint marker (None outside any savepoint) and the
    # INSERT parameters taken then.
    saves: list[tuple[_SavepointMarker | None, insert.Prepared]]


@dataclass
class HeldRows:
    """The rows held for one database, each with the context frame that saved it."""

    using: str
    entries: dict[int, _Entry] = field(default_factory=dict)  # by id(row), in save order

    def can_hold(self) -> bool:
        # A broken transaction must keep raising at save(), as a direct INSERT would.
        connection = connections[self.using]
        return connection.in_atomic_block and not connection.needs_rollback

    def hold(self, rows: Sequence[OutboxBase], frame: Any) -> None:
        marker = None
        if connections[self.using].savepoint_ids:
            marker = _SavepointMarker()
            transaction.on_commit(marker, using=self.using)
        for row in rows:
            # Taken now, so the row is written as it was saved, as a direct INSERT
            # would have written it, whatever changes before the commit.
            save = (marker, insert.prepare(row, self.using))
            entry = self.entries.get(id(row))
            if entry is None:
                self.entries[id(row)] = _Entry(frame, [save])
            else:
                entry.saves.append(save)  # saved again: written once, as last kept

    def write(self, *, then_commit: bool) -> list[tuple[OutboxBase, Any]]:
        """INSERT the rows to keep, in the order they were first saved, each as its last
        save that survived; return them with their frames. `then_commit`: the block ends
        here, so COMMIT in the same round trip where the database allows it."""
        connection = connections[self.using]
        entries = list(self.entries.values())
        self.discard()
        if connection.needs_rollback:
            return []
        alive = {id(callback) for _, callback, *_ in connection.run_on_commit}
        kept = []
        for entry in entries:
            saves = [save for marker, save in entry.saves if marker is None or id(marker) in alive]
            if saves:
                kept.append((saves[-1], entry.frame))
        if kept:
            insert.insert_prepared(
                [save for save, _ in kept],
                self.using,
                then_commit=then_commit and insert.can_commit_with_insert(self.using),
            )
        return [(save[2], frame) for save, frame in kept]

    def discard(self) -> None:
        self.entries = {}


def owned_database(atomic: Atomic | None) -> str | None:
    """The database whose outermost transaction `atomic` is about to open, if rows on it
    are to be held until its commit."""
    if atomic is None or not isinstance(atomic, Atomic) or not outbox_settings.DEFER_WRITES:
        return None
    using = atomic.using or DEFAULT_DB_ALIAS
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        return None
    return using
