"""The figures of the admin dashboard: per outbox table and scope, the backlog, its lag,
the shards' lease states (held, backing off, retry due, expired: only the last one
stuck), failing rows and dead letters.

The page shows only the tables the user may view (the view or change permission on that
outbox model: `outbox.admin.leases.viewable_outboxes`). All figures come from
`outbox.health.snapshot.table_status` (what `manage.py outbox_status` reports: a fixed
number of aggregate queries per table, lease states read through `ShardLease.objects`);
this module only shapes them for the template.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from outbox.categories import registry
from outbox.exceptions import InvalidOutboxMessage
from outbox.health.snapshot import table_status
from outbox.models import OutboxBase

# Dashboard column: key in a table_status scope entry.
SCOPE_COLUMNS = {
    "rows": "rows",
    "shards": "shards",
    "held": "held_shards",
    "expired": "expired_shards",
    "backing_off": "backing_off_shards",
    "retry_due": "retry_due_shards",
    "failing_rows": "failing_rows",
    "dead_letters": "dead_letters",
}


def dashboard_tables(models: Iterable[type[OutboxBase]]) -> list[dict[str, Any]]:
    """The figures of each table of `models`, in that order."""
    return [table_figures(model) for model in models]


def table_figures(model: type[OutboxBase]) -> dict[str, Any]:
    status = table_status(model)
    scopes = [scope_figures(scope) for scope in status["scopes"]]
    return {
        "label": status["table"],
        "verbose_name": model._meta.verbose_name_plural,
        "opts": model._meta,
        "database": status["database"],
        **{column: sum(scope[column] for scope in scopes) for column in SCOPE_COLUMNS},
        "lag_seconds": status.get("lag_seconds", 0.0),
        "lag": age(status.get("lag_seconds", 0.0)) if status.get("due_rows") else "",
        "scopes": scopes,
        "worst_shards": status.get("worst_shards", []),
    }


def scope_figures(scope: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": scope["scope"],
        "value": scope_value(scope["scope"]),
        **{column: scope.get(key, 0) for column, key in SCOPE_COLUMNS.items()},
        "lag_seconds": scope.get("lag_seconds", 0.0),
        "lag": age(scope["lag_seconds"]) if scope.get("due_rows") else "",
    }


def scope_value(name: str) -> int | None:
    """The stored integer of a scope named by table_status (for changelist filters)."""
    try:
        return int(registry.scope_by_name(name).value)
    except InvalidOutboxMessage:
        return None


def age(seconds: float) -> str:
    """A short human age: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    whole = int(seconds)
    for unit, size, minor, minor_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            return f"{whole // size} {unit} {whole % size // minor_size} {minor}"
    return f"{whole} s"
