"""The admin log of the messages an operator changed: one `LogEntry` per message, written
by the admin's actions (`outbox.admin.bulk`) and by `outbox_dead_letters retry|discard`
alike.

Each entry is Django's own admin log entry for the message's row (its content type, its
pk as object id), so the row's History page in the admin lists it; its change message
says what was done (retried, a dead letter revived, discarded), how the row was reached
(ticked, with its coalescing group, with its shard, by the command, as a dead letter of a
cause) and names the message: its id, its shard and its category by name. Entries are
written with one `bulk_create` per chunk of rows, in the transaction that changes those
rows.

Pausing and resuming a part of a table (`outbox.models.pause`) writes one entry too, on
the pause's row: an addition when paused, a deletion when resumed (`record_pause`).

Here, below the entry points, so that the admin and the management commands share one
audit (neither imports the other). The admin log is Django's `django.contrib.admin`,
which a project may leave out: its models are imported where an entry is written, never
when this module is, and `admin_log_installed` says whether there is one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import router, transaction
from django.db.models import QuerySet

from outbox.categories import registry
from outbox.models.outbox import OutboxBase
from outbox.models.pause import OutboxPause

# How an action reached a row besides the rows ticked (`Audit.reach`).
TICKED = ""
WITH_GROUP = "with its coalescing group"
WITH_SHARD = "with its shard"
BY_CAUSE = "as a dead letter of cause"  # followed by the cause's key
BY_COMMAND = "by outbox_dead_letters"  # the management command; a cause's after it

# Rows read, changed and logged per round: one `id IN (...)` each, within SQLite's
# 999 parameters.
CHUNK_ROWS = 500


def admin_log_installed() -> bool:
    """Whether the project has the admin log (`django.contrib.admin`) to write to."""
    return apps.is_installed("django.contrib.admin")


def audited_fields(model: type[OutboxBase]) -> tuple[str, ...]:
    """The columns an entry is made of: what `describe` and the row's title read."""
    return ("id", *model.shard_fields, "category", "message_id", "dead_at")


def audited_chunks(rows: QuerySet[Any]) -> Iterator[list[OutboxBase]]:
    """The rows of `rows` in id order, `CHUNK_ROWS` at a time, with the columns the admin
    log reads; locked until the transaction ends where the database can (FOR UPDATE), so
    that the rows logged are the rows changed. Read inside the transaction that changes
    them (`Audit.atomic`)."""
    fields = audited_fields(rows.model)
    ordered = rows.select_for_update().only(*fields).order_by("pk")
    chunk = list(ordered[:CHUNK_ROWS])
    while chunk:
        yield chunk
        if len(chunk) < CHUNK_ROWS:
            return
        chunk = list(ordered.filter(pk__gt=chunk[-1].pk)[:CHUNK_ROWS])


@dataclass(frozen=True)
class Audit:
    """Who acts, and how the action reached the rows it changes (`TICKED`, `WITH_GROUP`,
    `WITH_SHARD`, `BY_CAUSE` and a key, `BY_COMMAND`...): what every entry of the action
    records."""

    user_id: Any
    reach: str = TICKED

    def describe(self, row: OutboxBase, *, discarded: bool) -> str:
        """The entry's change message, e.g. `Retried now with its shard: message <uuid>,
        shard ORGANIZATION/3, category AUDIT_EVENT.`"""
        if discarded:
            did = "Discarded"
        elif row.dead_at is not None:
            did = "Retried now (a dead letter, revived)"
        else:
            did = "Retried now"
        how = f" {self.reach}" if self.reach else ""
        shard, category = registry.shard_name(row.shard_key), registry.category_name(row.category)
        return f"{did}{how}: message {row.message_id}, shard {shard}, category {category}."

    def record(self, rows: Sequence[OutboxBase], *, discarded: bool) -> None:
        """Write one entry per row (read before the change: a dead letter's entry says it
        was revived), in one `bulk_create`."""
        if not rows:
            return
        from django.contrib.admin.models import CHANGE, DELETION, LogEntry
        from django.contrib.contenttypes.models import ContentType

        model = type(rows[0])
        content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
        LogEntry.objects.bulk_create(
            LogEntry(
                user_id=self.user_id,
                content_type=content_type,
                object_id=str(row.pk),
                object_repr=str(row)[:200],
                action_flag=DELETION if discarded else CHANGE,
                change_message=self.describe(row, discarded=discarded),
            )
            for row in rows
        )

    @contextmanager
    def atomic(self, using: str) -> Iterator[None]:
        """One transaction for an action's changes on `using` and its entries. Where the
        admin log lives on another database, its transaction commits first: an entry may
        outlive a change that failed to commit, never the other way round."""
        from django.contrib.admin.models import LogEntry

        log_database = router.db_for_write(LogEntry)
        with transaction.atomic(using=using):
            if log_database == using:
                yield
            else:
                with transaction.atomic(using=log_database):
                    yield


def record_pause(user_id: Any, paused: OutboxPause, *, resumed: bool, how: str = "") -> None:
    """One entry for pausing or resuming (`resumed`) a part of a table, e.g. `Paused scope
    ORGANIZATION of outbox.regionoutbox by outbox_pause: bad deploy.`; `how` says
    by what (empty: the admin)."""
    from django.contrib.admin.models import ADDITION, DELETION, LogEntry
    from django.contrib.contenttypes.models import ContentType

    did = "Resumed" if resumed else "Paused"
    by = f" {how}" if how else ""
    reason = f": {paused.reason}" if paused.reason and not resumed else ""
    LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(OutboxPause),
        object_id=str(paused.pk),
        object_repr=str(paused)[:200],
        action_flag=DELETION if resumed else ADDITION,
        change_message=f"{did} {paused.part} of {paused.outbox}{by}{reason}.",
    )
