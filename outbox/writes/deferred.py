"""Outbox rows held back until their transaction commits: the opt-in deferred writer.

Turned on by `OUTBOX_DEFER_WRITES` or `outbox_context(..., defer=True)`. An
`outbox_context(transaction.atomic())` whose atomic opens the outermost transaction of
its database owns that transaction's end. Outbox rows saved on that database inside it
(at any depth, nested atomics included) are not INSERTed by `save()`: they are held here
and written with `bulk_create` as the block ends, just before its COMMIT. Where the
database allows it (PostgreSQL with psycopg 3 and client-side binding) the COMMIT rides
in the same round trip as the last INSERT, so the outbox rows of a transaction cost the
database work of their INSERT but no round trip of their own.

Each save takes a snapshot of the row (its payload as the JSON text validation checked),
so a row is written as it was at its last save that survived, as an immediate INSERT
would have written it. `pre_save` is sent by `save()`, `post_save` once the row is
written; until then a held row has no primary key and queries in the block do not see
it. Rows saved inside a savepoint that rolls back are not written (`internals`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from threading import get_ident
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models import signals
from django.db.transaction import Atomic

import outbox.internals as internals
from outbox.cursors import CommitWithInsert
from outbox.signals import announce_saved, messages_saved
from outbox.writes.insert import Snapshot, insert

if TYPE_CHECKING:
    from collections.abc import Sequence

    from django.db.backends.base.base import BaseDatabaseWrapper

    from outbox.models import OutboxBase

# Rows in the last INSERT, the one that carries the COMMIT: below every batch limit.
LAST_STATEMENT_ROWS = 500


@dataclass
class _Entry:
    row: OutboxBase
    frame: Any
    signals: bool  # saved by save() (sends pre/post_save), not bulk_create
    # Each save of the row: its savepoint marker (None outside any savepoint) and the
    # field values taken then.
    saves: list[tuple[internals.SavepointMarker | None, Snapshot]]


@dataclass
class HeldRows:
    """The rows held for one database, each with the context frame that saved it."""

    using: str
    # The connection of the transaction the context opened (this thread's): looked up
    # once, not at every save.
    connection: BaseDatabaseWrapper
    entries: dict[int, _Entry] = field(default_factory=dict)  # by id(row), in save order
    # The thread whose connection that is: Django's connections are per thread.
    thread: int = field(default_factory=get_ident)

    def can_hold(self) -> bool:
        # Only on the connection of the context's own thread (a thread given a copy of
        # the context, as sync_to_async does, saves on its own connection at once); and a
        # broken transaction must keep raising at save(), as an INSERT would.
        connection = self.connection
        if get_ident() != self.thread:
            return False
        return connection.in_atomic_block and not connection.get_rollback()

    def hold(
        self, rows: Sequence[OutboxBase], payloads: Sequence[str], frame: Any, *, saved: bool
    ) -> None:
        marker = internals.savepoint_marker(self.connection)
        for row, payload_json in zip(rows, payloads, strict=True):
            if saved and signals.pre_save.has_listeners(type(row)):
                signals.pre_save.send(
                    type(row), instance=row, raw=False, using=self.using, update_fields=None
                )
            save = (marker, _snapshot(row, payload_json))
            entry = self.entries.get(id(row))
            if entry is None:
                self.entries[id(row)] = _Entry(row, frame, saved, [save])
            else:
                entry.saves.append(save)  # saved again: written once, as last kept

    def write(self, commit_wrapper: CommitWithInsert | None) -> list[tuple[OutboxBase, Any]]:
        """INSERT the rows to keep, in the order they were first saved, each as its last
        save that survived; return them with their frames. The block ends here: with a
        `commit_wrapper` (the database's `commit_with_last_insert`) the COMMIT rides in
        the same round trip as the last INSERT."""
        entries = list(self.entries.values())
        self.discard()
        if self.connection.get_rollback():
            return []
        pending: set[int] | None = None  # read only where a save was inside a savepoint
        kept: list[tuple[_Entry, Snapshot]] = []
        for entry in entries:
            if len(entry.saves) == 1 and entry.saves[0][0] is None:
                kept.append((entry, entry.saves[0][1]))
                continue
            if pending is None:
                pending = internals.pending_markers(self.connection)
            saves = [
                values for marker, values in entry.saves if marker is None or id(marker) in pending
            ]
            if saves:
                kept.append((entry, saves[-1]))
        self._insert(kept, commit_wrapper)
        return [(entry.row, entry.frame) for entry, _ in kept]

    def _insert(
        self, kept: list[tuple[_Entry, Snapshot]], wrapper: CommitWithInsert | None
    ) -> None:
        by_table: dict[type[OutboxBase], list[tuple[_Entry, Snapshot]]] = defaultdict(list)
        for entry, snapshot in kept:
            by_table[type(entry.row)].append((entry, snapshot))
        tables = list(by_table.items())
        for index, (model, pairs) in enumerate(tables):
            last = wrapper is not None and index == len(tables) - 1
            snapshots = [snapshot for _, snapshot in pairs]
            written = self._write_table(model, snapshots, commit_wrapper=wrapper if last else None)
            for (entry, _), values in zip(pairs, written, strict=True):
                internals.mark_written(entry.row, values, self.using)
                if entry.signals and signals.post_save.has_listeners(model):
                    signals.post_save.send(
                        model,
                        instance=entry.row,
                        created=True,
                        update_fields=None,
                        raw=False,
                        using=self.using,
                    )
            if messages_saved.receivers:
                announce_saved([entry.row for entry, _ in pairs], self.using)

    def _write_table(
        self, model: type[OutboxBase], snapshots: list[Snapshot], commit_wrapper: Any
    ) -> list[Snapshot]:
        """INSERT the rows; return each one's primary key and database defaults."""
        if commit_wrapper is None:
            return self._bulk_create(model, snapshots)
        # Only the last statement may carry the COMMIT: make it one of its own, written
        # by hand (`insert`), since the COMMIT rides along on PostgreSQL only.
        head, tail = snapshots[:-LAST_STATEMENT_ROWS], snapshots[-LAST_STATEMENT_ROWS:]
        written = self._bulk_create(model, head) if head else []
        returned = insert(model, tail, self.connection, commit_wrapper)
        if returned is None:
            with self.connection.execute_wrapper(commit_wrapper):
                returned = self._bulk_create(model, tail, batch_size=len(tail))
        return written + returned

    def _bulk_create(
        self, model: type[OutboxBase], snapshots: list[Snapshot], **options: Any
    ) -> list[Snapshot]:
        instances = [_instance(model, snapshot) for snapshot in snapshots]
        plain: models.QuerySet[Any] = models.QuerySet(model, using=self.using)
        plain.bulk_create(instances, **options)
        return [vars(instance) for instance in instances]

    def discard(self) -> None:
        self.entries = {}


def _snapshot(row: OutboxBase, payload_json: str) -> Snapshot:
    """The row's field values now; the payload as its checked JSON text and the
    headers as a copy, so later changes to them (even in place) do not reach the table."""
    values = row.__dict__
    snapshot = {
        name: values[name] if name in values else getattr(row, name)
        for name in _written_attnames(type(row))
    }
    snapshot["payload"] = payload_json
    if snapshot.get("headers"):
        snapshot["headers"] = dict(snapshot["headers"])
    return snapshot


@cache
def _written_attnames(model: type[OutboxBase]) -> tuple[str, ...]:
    return tuple(f.attname for f in model._meta.concrete_fields if not f.primary_key)


def _instance(model: type[OutboxBase], snapshot: Snapshot) -> OutboxBase:
    """A new instance of the row as it was saved, for bulk_create."""
    return model(**{**snapshot, "payload": json.loads(snapshot["payload"])})


def held_rows_for(atomic: Atomic | None, defer: bool) -> HeldRows | None:
    """Where to hold the rows of the database whose outermost transaction `atomic` is
    about to open, if rows on it are to be held until its commit; else None."""
    if not defer or atomic is None or not isinstance(atomic, Atomic):
        return None
    using = atomic.using or DEFAULT_DB_ALIAS
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        return None
    if not connection.features.can_return_rows_from_bulk_insert:
        return None  # held rows could not get their primary keys: write them at once
    return HeldRows(using, connection)
