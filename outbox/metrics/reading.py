"""One reading of a table for the gauges: per scope, the backlog and what is wrong now.

Three aggregate queries per table, whatever its size: the pending rows per scope (rows,
shards, due rows and shards, failing shards, the oldest due row), the dead letters per
scope, and the abandoned leases per scope with, in the same statement (UNION ALL), the
pauses per scope (`OutboxPause`: both tables are small). The states come from where they are named
once: `pending()` and `dead()` on the outbox QuerySet, `abandoned()` on the lease
QuerySet (what `outbox_status` calls expired shards). "Due" is judged on the database
clock, as `outbox_status` does; ages are taken on this server's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import CharField, Count, Min, Q, QuerySet, Value
from django.db.models.functions import Now
from django.utils import timezone

from outbox.categories import registry
from outbox.metrics.base import ScopeHealth
from outbox.models import OutboxBase, OutboxPause, ShardLease

__all__ = ["ScopeReading", "read_table"]


@dataclass
class ScopeReading:
    """The backlog of one scope (pending rows and their shards) and its health."""

    rows: int = 0
    shards: int = 0
    health: ScopeHealth = field(default_factory=ScopeHealth)


def read_table(model: type[OutboxBase], using: str | None) -> dict[str, ScopeReading]:
    """{scope name: reading} for every scope with pending rows, dead letters, abandoned
    leases or pauses in the table, on `using` or the table's default database."""
    alias = using or model._default_manager.db
    manager = model._default_manager.using(alias)
    now = timezone.now()
    found: dict[int, dict[str, float]] = {}
    due = Q(scheduled_for__lte=Now())
    per_scope = (
        manager.pending()
        .order_by()
        .values("shard_scope")
        .annotate(
            rows=Count("id"),
            shards=Count("shard_identifier", distinct=True),
            due_rows=Count("id", filter=due),
            due_shards=Count("shard_identifier", distinct=True, filter=due),
            failing_shards=Count("shard_identifier", distinct=True, filter=Q(attempts__gt=0)),
            oldest_due=Min("date_added", filter=due),
        )
    )
    for entry in per_scope:
        oldest = entry.pop("oldest_due")
        found[entry.pop("shard_scope")] = {**entry, "oldest_due_age_seconds": _age(now, oldest)}
    for scope, dead in _count_per_scope(manager.dead()):
        found.setdefault(scope, {})["dead_letters"] = dead
    leases = ShardLease.objects.using(alias).of(model)
    abandoned = _per_scope(leases.abandoned(), "expired_leases")
    pauses = _per_scope(OutboxPause.objects.using(alias).of(model), "paused_parts")
    for entry in abandoned.union(pauses, all=True):
        found.setdefault(entry["shard_scope"], {})[entry["figure"]] = entry["n"]
    return {registry.scope_name(scope): _reading(values) for scope, values in found.items()}


def _per_scope(rows: QuerySet[Any], figure: str) -> QuerySet[Any]:
    """The rows counted per scope, each count named `figure`."""
    counted = rows.order_by().values("shard_scope").annotate(n=Count("id"))
    named: QuerySet[Any] = counted.annotate(figure=Value(figure, output_field=CharField()))
    return named


def _count_per_scope(rows: QuerySet[Any]) -> list[tuple[int, int]]:
    per_scope = rows.order_by().values("shard_scope").annotate(n=Count("id"))
    return [(entry["shard_scope"], entry["n"]) for entry in per_scope]


def _reading(values: dict[str, float]) -> ScopeReading:
    return ScopeReading(
        rows=int(values.get("rows", 0)),
        shards=int(values.get("shards", 0)),
        health=ScopeHealth(
            oldest_due_age_seconds=float(values.get("oldest_due_age_seconds", 0.0)),
            due_rows=int(values.get("due_rows", 0)),
            due_shards=int(values.get("due_shards", 0)),
            failing_shards=int(values.get("failing_shards", 0)),
            dead_letters=int(values.get("dead_letters", 0)),
            expired_leases=int(values.get("expired_leases", 0)),
            paused_parts=int(values.get("paused_parts", 0)),
        ),
    )


def _age(now: datetime, then: datetime | None) -> float:
    return max((now - then).total_seconds(), 0.0) if then is not None else 0.0
