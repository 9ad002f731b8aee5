"""A snapshot of the backlog, shared by `manage.py outbox_status` and the admin."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max, Min
from django.db.models.functions import Now
from django.utils import timezone

from outbox.categories import registry
from outbox.models import OutboxBase, ShardLease


def table_status(model: type[OutboxBase], using: str | None = None) -> dict[str, Any]:
    """Counts of one outbox table: rows, due rows, shards, leases, the oldest row, per scope.

    Leases by state: `leased_shards` held by a live worker, `backing_off_shards` waiting
    out a failure, `expired_shards` whose lease or back-off is over (a dead worker's, or
    not yet cleaned up): claimable again."""
    alias = using or model._default_manager.db
    rows = model._default_manager.using(alias)
    leases = ShardLease.objects.using(alias).of(model)
    totals = rows.aggregate(
        rows=Count("id"), oldest=Min("date_added"), max_attempts=Max("attempts")
    )
    oldest = totals["oldest"]
    scopes = (
        rows.values("shard_scope")
        .annotate(rows=Count("id"), shards=Count("shard_identifier", distinct=True))
        .order_by("shard_scope")
    )
    return {
        "table": model._meta.label,
        "database": alias,
        "rows": totals["rows"],
        "due_rows": rows.filter(scheduled_for__lte=Now()).count(),
        "failing_rows": rows.filter(attempts__gt=0).count(),
        "max_attempts": totals["max_attempts"] or 0,
        "oldest_age_seconds": (timezone.now() - oldest).total_seconds() if oldest else 0.0,
        "leased_shards": leases.held().count(),
        "backing_off_shards": leases.backing_off().count(),
        "expired_shards": leases.expired().count(),
        "scopes": [
            {
                "scope": _scope_name(entry["shard_scope"]),
                "rows": entry["rows"],
                "shards": entry["shards"],
            }
            for entry in scopes
        ],
    }


def _scope_name(value: int) -> str:
    scope = registry.scopes.get(value)
    return scope.name if scope is not None else str(value)
