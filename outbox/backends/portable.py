"""The portable path: the ORM only, correct on SQLite, PostgreSQL and MariaDB/MySQL.

Exclusivity rests on the unique key of `ShardLease`: a free shard is claimed by
inserting its lease row (a concurrent insert of the same key is ignored), an expired
one by a single UPDATE guarded by `expires_at <= now`, which every database evaluates
against the latest committed row. All times are the database's `Now()`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import reduce
from typing import Any, cast

from django.db.models import (
    Case,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Now

from outbox.backends.base import FailedGroup, Lease, OutboxBackend, Window, coalesce
from outbox.models import OutboxBase, ShardLease
from outbox.shards import ShardKey


def db_now_plus(seconds: float) -> ExpressionWrapper[Any]:
    """The database clock plus a delay, as an expression."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def any_of(conditions: Sequence[Q]) -> Q:
    """OR of the conditions; matches nothing when there are none."""
    return reduce(operator.or_, conditions) if conditions else Q(pk__in=[])


def lease_key(key: ShardKey) -> Q:
    return Q(
        region_name=key.region_name,
        shard_scope=key.shard_scope,
        shard_identifier=key.shard_identifier,
    )


class PortableBackend(OutboxBackend):
    def leases(self, model: type[OutboxBase]) -> QuerySet[ShardLease]:
        leases = ShardLease._default_manager.using(self.using)
        return cast("QuerySet[ShardLease]", leases.filter(outbox=model._meta.label_lower))

    def rows(self, model: type[OutboxBase]) -> QuerySet[Any]:
        return cast("QuerySet[Any]", model._default_manager.using(self.using))

    def lease_of_row(self, model: type[OutboxBase]) -> dict[str, Any]:
        """Lookups matching a lease row to the outer outbox row's shard."""
        refs: dict[str, Any] = {field: OuterRef(field) for field in model.shard_fields}
        refs.setdefault("region_name", "")
        return refs

    def find_due_shards(
        self,
        model: type[OutboxBase],
        limit: int,
        *,
        within: Sequence[ShardKey] | None = None,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
    ) -> list[ShardKey]:
        due = self.rows(model).filter(scheduled_for__lte=Now())
        if within is not None:
            due = due.filter(any_of([Q(**model.shard_lookup(key)) for key in within]))
        if scopes:
            due = due.filter(shard_scope__in=scopes)
        if identifiers:
            due = due.filter(shard_identifier__in=identifiers)
        live = self.leases(model).filter(expires_at__gt=Now(), **self.lease_of_row(model))
        heads = (
            due.filter(~Exists(live))
            .values(*model.shard_fields)
            .annotate(head=Min("id"))
            .order_by("head")[:limit]
        )
        return [model.shard_key_of([head[f] for f in model.shard_fields]) for head in heads]

    def claim(self, model: type[OutboxBase], shards: Sequence[ShardKey], lease: Lease) -> None:
        if not shards:
            lease.shards = []
            return
        label = model._meta.label_lower
        expires = db_now_plus(lease.seconds)
        taken = {"token": lease.token, "holder": lease.holder, "expires_at": expires}
        # Take over expired leases; the guard is re-checked on the row itself, so two
        # workers cannot both win one.
        self.leases(model).filter(expires_at__lte=Now()).filter(
            any_of([lease_key(key) for key in shards])
        ).update(claimed_at=Now(), **taken)
        # Insert leases for shards that have none; a lease someone else holds stays.
        ShardLease.objects.using(self.using).bulk_create(
            [
                ShardLease(
                    outbox=label,
                    region_name=key.region_name,
                    shard_scope=key.shard_scope,
                    shard_identifier=key.shard_identifier,
                    **taken,
                )
                for key in shards
            ],
            ignore_conflicts=True,
        )
        won = self.held(model, lease)
        lease.shards = [key for key in shards if key in won]

    def held(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        keys = self.leases(model).filter(token=lease.token)
        return {
            ShardKey(*values)
            for values in keys.values_list("region_name", "shard_scope", "shard_identifier")
        }

    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        renewed = (
            self.leases(model)
            .filter(token=lease.token)
            .update(expires_at=db_now_plus(lease.seconds))
        )
        if renewed == len(lease.shards):
            return set(lease.shards)
        return self.held(model, lease)

    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
    ) -> Window:
        selectors = [Q(**model.shard_lookup(key)) for key in shards]
        columns = (*model.shard_fields, "id", "category", "object_identifier", "attempts")
        rows = list(
            self.rows(model).filter(any_of(selectors)).order_by("id").values_list(*columns)[:limit]
        )
        groups, _, _ = coalesce(model, rows)
        # One window for all shards: when it is full, any shard may continue past it.
        incomplete = set(shards) if len(rows) >= limit else set()
        newest_ids = [group.newest_id for shard_groups in groups.values() for group in shard_groups]
        # One query (in_bulk would split it into batches on SQLite).
        newest = {row.id: row for row in self.rows(model).filter(id__in=newest_ids)}
        for shard_groups in groups.values():
            for group in shard_groups:
                group.message = newest.get(group.newest_id)
        return Window(groups, incomplete)

    def retire(
        self, model: type[OutboxBase], lease: Lease, row_ids: Mapping[ShardKey, Sequence[int]]
    ) -> tuple[int, set[ShardKey]]:
        ids = [row_id for shard_ids in row_ids.values() for row_id in shard_ids]
        if not ids:
            return 0, set()
        ours = self.leases(model).filter(token=lease.token, **self.lease_of_row(model))
        deleted = self.rows(model).filter(id__in=ids).filter(Exists(ours))._raw_delete(self.using)
        if deleted == len(ids):
            return deleted, set()
        # Fewer rows went than asked: either a lease was lost, or an operator removed
        # rows meanwhile. Only the former is a lost shard.
        still_held = self.held(model, lease)
        return deleted, {key for key in row_ids if key not in still_held}

    def reschedule(
        self, model: type[OutboxBase], lease: Lease, failures: Sequence[FailedGroup]
    ) -> None:
        if not failures:
            return
        next_attempt = Case(
            *[
                When(id=row_id, then=db_now_plus(delay))
                for failure in failures
                for row_id, delay in failure.row_delays.items()
            ],
            output_field=DateTimeField(),
        )
        error = Case(
            *[
                When(id__in=list(failure.row_delays), then=Value(failure.error))
                for failure in failures
            ],
            default=F("last_error"),
            output_field=TextField(),
        )
        self.rows(model).filter(
            id__in=[row_id for failure in failures for row_id in failure.row_delays]
        ).update(
            attempts=F("attempts") + 1,
            scheduled_from=Now(),
            scheduled_for=next_attempt,
            first_attempt_at=Coalesce(F("first_attempt_at"), Now()),
            last_attempt_at=Now(),
            last_error=error,
        )
        # Keep the lease row, without a holder, until the shard may be retried: the
        # shard stays blocked (its later groups wait) for the back-off of its head.
        backoff = Case(
            *[
                When(lease_key(failure.shard), then=db_now_plus(failure.block_seconds))
                for failure in failures
            ],
            output_field=DateTimeField(),
        )
        self.leases(model).filter(token=lease.token).filter(
            any_of([lease_key(failure.shard) for failure in failures])
        ).update(token=None, expires_at=backoff)

    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        if shards:
            self.leases(model).filter(token=lease.token).filter(
                any_of([lease_key(key) for key in shards])
            )._raw_delete(self.using)
