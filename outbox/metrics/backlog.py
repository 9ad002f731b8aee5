"""The backlog reading: rows and shards waiting per table and scope, and what is wrong
now (`ScopeHealth`), reported to the installed metrics; on PostgreSQL also the vacuum
health of each database read (`outbox.health.vacuum`)."""

from __future__ import annotations

import time

from django.db.models import Model

from outbox.categories import registry
from outbox.health import vacuum
from outbox.metrics.base import Metrics, table_label
from outbox.metrics.feed import installed
from outbox.metrics.reading import ScopeReading, read_table
from outbox.models import outbox_models

__all__ = ["record_backlog"]


def record_backlog(using: str | None = None, metrics: Metrics | None = None) -> None:
    """Report, per outbox table and scope, the backlog (rows and distinct shards) and
    its health: the oldest due row's age, due rows and shards, failing shards, dead
    letters, expired leases, paused parts; on PostgreSQL, per database, the oldest xmin holder's age
    and the dead tuples of its outbox tables and lease table; then the time of the
    reading, per table.

    Four aggregate queries per table (`outbox.metrics.reading`), on `using` or the
    table's default database, and three per PostgreSQL database for its vacuum
    health. Every declared scope is reported, as 0 when empty, and so is an undeclared
    one reported before: a gauge never keeps a stale value, even in Prometheus'
    multiprocess mode where another process may have reported it. Nothing happens (no
    query) when no metrics are installed and none are given."""
    metrics = metrics or installed()
    if metrics is None:
        return
    on_database: dict[str, list[type[Model]]] = {}
    for model in outbox_models():
        table = table_label(model)
        on_database.setdefault(using or model._default_manager.db, []).append(model)
        readings = read_table(model, using)
        seen = _reported.setdefault((using or "", table), set())
        declared = {registry.scope_name(value) for value in registry.scopes}
        for scope in sorted((seen | declared) - readings.keys()):
            _report(metrics, table, scope, ScopeReading())
        for scope, reading in readings.items():
            _report(metrics, table, scope, reading)
        seen.update(readings)
        metrics.gauges_read(table, time.time())
    for alias, models in on_database.items():
        _report_vacuum(metrics, alias, models)


_reported: dict[tuple[str, str], set[str]] = {}  # (database, table) -> scopes seen, to zero


def _report_vacuum(metrics: Metrics, alias: str, models: list[type[Model]]) -> None:
    """What holds vacuum back on `alias`, and its tables' dead tuples (PostgreSQL only)."""
    reading = vacuum.read(alias, models)
    if reading is None:
        return
    holder = reading["oldest_xmin"]
    if holder is None:
        metrics.xmin_horizon(alias, 0.0, 0)
    else:
        metrics.xmin_horizon(alias, holder["age_seconds"], int(holder["xid_age"] or 0))
    for table, figures in reading["tables"].items():
        if figures["dead_tuples"] is not None:  # None: no statistics for it there
            metrics.dead_tuples(table, alias, int(figures["dead_tuples"]))


def _report(metrics: Metrics, table: str, scope: str, reading: ScopeReading) -> None:
    metrics.backlog(table, scope, reading.rows, reading.shards)
    metrics.health(table, scope, reading.health)
