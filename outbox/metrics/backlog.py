"""The backlog reading: rows and shards waiting per table and scope."""

from __future__ import annotations

from django.db.models import Count

from outbox.categories import registry
from outbox.metrics.base import Metrics, table_label
from outbox.metrics.feed import installed
from outbox.models import OutboxBase, outbox_models

__all__ = ["record_backlog"]


def record_backlog(using: str | None = None, metrics: Metrics | None = None) -> None:
    """Report the backlog of every outbox table per scope: rows and distinct shards.

    One aggregate query per table, on `using` or the table's default database. Scopes
    reported before and now empty are reported as 0. Nothing happens (no query) when
    no metrics are installed and none are given."""
    metrics = metrics or installed()
    if metrics is None:
        return
    for model in outbox_models():
        table = table_label(model)
        counts = {
            registry.scope_name(scope): (rows, shards)
            for scope, rows, shards in _backlog(model, using)
        }
        seen = _reported.setdefault((using or "", table), set())
        for scope in sorted(seen - counts.keys()):
            metrics.backlog(table, scope, 0, 0)
        for scope, (rows, shards) in counts.items():
            metrics.backlog(table, scope, rows, shards)
        seen.update(counts)


_reported: dict[tuple[str, str], set[str]] = {}  # (database, table) -> scopes seen, to zero


def _backlog(model: type[OutboxBase], using: str | None) -> list[tuple[int, int, int]]:
    """(scope, rows, shards) of the pending rows (not dead letters); shards counted by
    shard_identifier within a scope, as `outbox_status` does."""
    manager = model._default_manager.using(using or model._default_manager.db)
    per_scope = (
        manager.pending()
        .order_by()
        .values("shard_scope")
        .annotate(rows=Count("id"), shards=Count("shard_identifier", distinct=True))
        .values_list("shard_scope", "rows", "shards")
    )
    return list(per_scope)
