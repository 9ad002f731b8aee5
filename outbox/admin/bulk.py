"""Retry and discard for the admin, in a bounded number of statements and bounded memory.

Rows are changed by UPDATE / DELETE over filters, never loaded into Python. Actions on
groups or shards first read the distinct keys of the selection, at most `MAX_KEYS` of
them (which also keeps each statement within SQLite's parameter limit), then change the
rows of those keys in one statement. A shard that a worker holds right now is left
alone: its holder settles it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce
from typing import Any

from django.apps import apps
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now

from outbox.models import OutboxBase, OutboxQuerySet, ShardLease, ShardLeaseQuerySet

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


def retry_rows(rows: QuerySet[Any]) -> Outcome:
    """Make `rows` due now (dead letters too) and lift their shards' back-off, except in
    held shards."""
    held_shards = _held_shards(rows)
    free: OutboxQuerySet[Any] = rows.filter(~_is_held(rows.model, rows.db))
    updated = free.pending().update(scheduled_for=Now(), scheduled_from=Now())
    # Dead letters selected come back to their shard, due now, attempts reset.
    revived = free.retry_dead()
    lifted = _lift_backoff(free)
    return Outcome(rows=updated + revived, lifted=lifted, held_shards=held_shards)


def discard_rows(rows: QuerySet[Any]) -> Outcome:
    """Delete `rows` and lift their shards' back-off (what is left there is delivered
    next), except in held shards."""
    held_shards = _held_shards(rows)
    free = rows.filter(~_is_held(rows.model, rows.db))
    lifted = _lift_backoff(free)  # first: it finds the shards through the rows
    deleted = free.delete()[0]
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


def retry_keys(selected: QuerySet[Any], fields: tuple[str, ...]) -> Outcome:
    rows, capped = rows_of_keys(selected, fields)
    return retry_rows(rows) + Outcome(capped=capped)


def discard_keys(selected: QuerySet[Any], fields: tuple[str, ...]) -> Outcome:
    rows, capped = rows_of_keys(selected, fields)
    return discard_rows(rows) + Outcome(capped=capped)


def retry_leases(leases: ShardLeaseQuerySet) -> Outcome:
    """Retry the shards of the selected leases: their rows due now, their back-off
    lifted; held shards are left alone. A few statements per outbox table."""
    total = Outcome(held_shards=leases.held().count())
    for label in leases.order_by().values_list("outbox", flat=True).distinct():
        model: type[OutboxBase] = apps.get_model(label)
        of_table = leases.filter(outbox=label)
        same_shard = {field: OuterRef(field) for field in model.shard_fields}
        free = Exists(of_table.backing_off().filter(**same_shard)) | Exists(
            of_table.expired().filter(**same_shard)
        )
        rows = model._default_manager.using(leases.db).filter(free)
        updated = rows.update(scheduled_for=Now(), scheduled_from=Now())
        total += Outcome(rows=updated, lifted=of_table.backing_off().delete()[0])
    return total
