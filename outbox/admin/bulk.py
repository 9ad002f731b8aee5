"""Retry and discard for the admin, in bounded memory and a number of statements that
grows only with the chunks of rows changed.

Actions on groups or shards first read the distinct keys of the selection, at most
`MAX_KEYS` of them (which also keeps each statement within SQLite's parameter limit).
The rows an action changes are then read `CHUNK_ROWS` at a time in id order, only the
columns the admin log needs, locked where the database can (FOR UPDATE) so that the
rows read are the rows changed; each chunk is changed by one UPDATE / DELETE of those
ids and recorded with one admin log entry per row (`outbox.models.audit`, which
`outbox_dead_letters` shares), all in one transaction. A shard that a worker holds right
now is left alone: its holder settles it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce
from typing import Any

from django.apps import apps
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now

from outbox.models import OutboxBase, ShardLease, ShardLeaseQuerySet
from outbox.models.audit import CHUNK_ROWS as CHUNK_ROWS  # rows read, changed, logged per round
from outbox.models.audit import Audit, audited_chunks

# Shards or coalescing groups per action; the rest wait for the action to run again.
MAX_KEYS = 200
GROUP_FIELDS = ("category", "object_identifier")


@dataclass(frozen=True)
class Outcome:
    """What one action did: rows made due or deleted, back-offs lifted, shards left alone
    because a worker holds them, and whether the selection had more keys than MAX_KEYS."""

    rows: int = 0
    lifted: int = 0
    held_shards: int = 0
    capped: bool = False

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(
            self.rows + other.rows,
            self.lifted + other.lifted,
            self.held_shards + other.held_shards,
            self.capped or other.capped,
        )


def _is_held(model: type[OutboxBase], alias: str) -> Exists:
    """True for a row whose shard a worker holds (an outer outbox row)."""
    same_shard: dict[str, Any] = {field: OuterRef(field) for field in model.shard_fields}
    same_shard.setdefault("region_name", "")
    return Exists(ShardLease.objects.using(alias).of(model).held().filter(**same_shard))


def _held_shards(rows: QuerySet[Any]) -> int:
    model = rows.model
    held = rows.filter(_is_held(model, rows.db)).order_by()
    shards: int = held.values_list(*model.shard_fields).distinct().count()
    return shards


def _lift_backoff(rows: QuerySet[Any]) -> int:
    """Delete the leases no live worker holds (a back-off, or one that ran out: a back-off
    over, a dead worker's) of the shards of `rows` (one statement)."""
    model = rows.model
    of_lease = {field: OuterRef(field) for field in model.shard_fields}
    leases = ShardLease.objects.using(rows.db).of(model).not_held()
    lifted: int = leases.filter(Exists(rows.filter(**of_lease))).delete()[0]
    return lifted


def _retry_chunk(table: QuerySet[Any], chunk: list[OutboxBase], audit: Audit) -> int:
    """Make the rows of `chunk` due now (dead letters revived) and log each one."""
    audit.record(chunk, discarded=False)
    pending = [row.pk for row in chunk if row.dead_at is None]
    dead = [row.pk for row in chunk if row.dead_at is not None]
    updated = 0
    if pending:
        updated += table.filter(pk__in=pending).update(scheduled_for=Now(), scheduled_from=Now())
    if dead:
        # Dead letters come back to their shard, due now, attempts reset.
        updated += table.filter(pk__in=dead).retry_dead()
    return updated


def retry_rows(rows: QuerySet[Any], audit: Audit) -> Outcome:
    """Make `rows` due now (dead letters too) and lift their shards' back-off, except in
    held shards; one admin log entry per row changed."""
    held_shards = _held_shards(rows)
    free = rows.filter(~_is_held(rows.model, rows.db))
    table = rows.model._default_manager.using(rows.db)
    with audit.atomic(rows.db):
        updated = sum(_retry_chunk(table, chunk, audit) for chunk in audited_chunks(free))
        lifted = _lift_backoff(free)
    return Outcome(rows=updated, lifted=lifted, held_shards=held_shards)


def discard_rows(rows: QuerySet[Any], audit: Audit) -> Outcome:
    """Delete `rows` and lift their shards' back-off (what is left there is delivered
    next), except in held shards; one admin log entry per row deleted."""
    held_shards = _held_shards(rows)
    free = rows.filter(~_is_held(rows.model, rows.db))
    table = rows.model._default_manager.using(rows.db)
    deleted = 0
    with audit.atomic(rows.db):
        lifted = _lift_backoff(free)  # first: it finds the shards through the rows
        for chunk in audited_chunks(free):
            audit.record(chunk, discarded=True)
            deleted += table.filter(pk__in=[row.pk for row in chunk]).delete()[0]
    return Outcome(rows=deleted, lifted=lifted, held_shards=held_shards)


def rows_of_keys(selected: QuerySet[Any], fields: tuple[str, ...]) -> tuple[QuerySet[Any], bool]:
    """All rows of the table sharing `fields` with a selected row (up to MAX_KEYS distinct
    keys), and whether keys were left out."""
    model = selected.model
    keys = list(selected.order_by().values_list(*fields).distinct()[: MAX_KEYS + 1])
    capped = len(keys) > MAX_KEYS
    matches = [Q(**dict(zip(fields, key, strict=True))) for key in keys[:MAX_KEYS]]
    rows = model._default_manager.using(selected.db)
    if not matches:
        return rows.none(), False
    return rows.filter(reduce(operator.or_, matches)), capped


def group_fields(model: type[OutboxBase]) -> tuple[str, ...]:
    """The columns of a coalescing group: the shard, the category, the object."""
    return (*model.shard_fields, *GROUP_FIELDS)


def retry_keys(selected: QuerySet[Any], fields: tuple[str, ...], audit: Audit) -> Outcome:
    rows, capped = rows_of_keys(selected, fields)
    return retry_rows(rows, audit) + Outcome(capped=capped)


def discard_keys(selected: QuerySet[Any], fields: tuple[str, ...], audit: Audit) -> Outcome:
    rows, capped = rows_of_keys(selected, fields)
    return discard_rows(rows, audit) + Outcome(capped=capped)


def retry_leases(leases: ShardLeaseQuerySet, audit: Audit) -> Outcome:
    """Retry the shards of the selected leases: their pending rows due now (one admin log
    entry each), their back-off lifted; held shards are left alone. A few statements per
    outbox table, and a few per chunk of rows."""
    total = Outcome(held_shards=leases.held().count())
    with audit.atomic(leases.db):
        for label in leases.order_by().values_list("outbox", flat=True).distinct():
            model: type[OutboxBase] = apps.get_model(label)
            of_table = leases.filter(outbox=label)
            same_shard = {field: OuterRef(field) for field in model.shard_fields}
            free = Exists(of_table.backing_off().filter(**same_shard)) | Exists(
                of_table.expired().filter(**same_shard)
            )
            table = model._default_manager.using(leases.db)
            rows = table.filter(free).pending()
            updated = sum(_retry_chunk(table, chunk, audit) for chunk in audited_chunks(rows))
            total += Outcome(rows=updated, lifted=of_table.backing_off().delete()[0])
    return total
