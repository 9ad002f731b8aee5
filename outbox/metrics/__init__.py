"""Metrics: one small interface, an adapter chosen by `OUTBOX_METRICS`, fed by signals.

`install()` (called when the app is ready) builds the adapter that `OUTBOX_METRICS`
names and connects receivers to the lifecycle signals (`outbox.signals`); with the
setting unset it connects nothing, so the engine's `has_listeners()` checks skip the
signals and metrics cost nothing. `record_backlog()` reads the backlog per table and
scope, one aggregate query per table, for the drain loop's heartbeat (and, with
`PrometheusScrapeMetrics`, for each scrape); it too does nothing when unset.

Every metric is prefixed ``outbox`` and labelled with the table (its model label, e.g.
``outbox.RegionOutbox``) and the scope and category names:

- saved, processed (rows; coalesced rows included), failed, dead_lettered: counters
  per table, scope and category;
- leases_lost: counter per table and scope;
- processing_lag (age of the delivered row, seconds) and send_duration (the receivers'
  time, seconds): histograms per table, scope and category;
- receiver_duration (one receiver's time, seconds): histogram per table, scope, category
  and receiver (`module.qualname`);
- claim_duration (one claim of shards, seconds): histogram per table;
- backlog_rows and backlog_shards: gauges per table and scope.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sized
from typing import Any

from django.db.models import Count
from django.dispatch import Signal
from django.utils.module_loading import import_string

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.exceptions import OutboxConfigurationError
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey
from outbox.signals import (
    delivery_failed,
    lease_lost,
    message_dead_lettered,
    message_processed,
    messages_saved,
    shards_claimed,
)

__all__ = [
    "ADAPTERS",
    "Metrics",
    "build_metrics",
    "install",
    "installed",
    "record_backlog",
    "uninstall",
]

logger = logging.getLogger(__name__)

ADAPTERS = {
    "prometheus": "outbox.metrics.prometheus.PrometheusMetrics",
    "statsd": "outbox.metrics.statsd.StatsdMetrics",
    "opentelemetry": "outbox.metrics.otel.OpenTelemetryMetrics",
}
"""The short names `OUTBOX_METRICS` accepts, and the adapter class each one stands for."""


class Metrics:
    """Where the outbox reports what it did. Every method here is a no-op.

    An adapter overrides the methods its backend records. `table` is the outbox model's
    label, `scope` and `category` are member names (the stored integer as text if no
    enum declares it). Methods are called from the receivers of the lifecycle signals,
    in the thread that did the work; an exception they raise is logged, never passed on
    to the engine.
    """

    def saved(self, table: str, scope: str, category: str, count: int) -> None:
        """`count` rows of one scope and category were written."""

    def processed(
        self,
        table: str,
        scope: str,
        category: str,
        rows: int,
        lag_seconds: float | None,
        duration_seconds: float,
    ) -> None:
        """A message was delivered, retiring `rows` rows (coalesced ones included)."""

    def failed(self, table: str, scope: str, category: str) -> None:
        """A delivery failed (it is retried later, or was dead-lettered)."""

    def dead_lettered(self, table: str, scope: str, category: str) -> None:
        """A message ran out of attempts and became a dead letter."""

    def lease_lost(self, table: str, scope: str) -> None:
        """A worker found its lease on a shard of `scope` gone before it settled."""

    def backlog(self, table: str, scope: str, rows: int, shards: int) -> None:
        """`rows` rows in `shards` shards of `scope` were waiting, at one reading."""

    def receiver_finished(
        self, table: str, scope: str, category: str, receiver: str, duration_seconds: float
    ) -> None:
        """One receiver (`module.qualname`) ran for a message, for `duration_seconds`."""

    def claimed(self, table: str, shards: int, duration_seconds: float) -> None:
        """A claim of shards took `duration_seconds` and won `shards` (maybe 0)."""


def build_metrics() -> Metrics | None:
    """The adapter `OUTBOX_METRICS` chooses, freshly built; None when it is unset."""
    choice = outbox_settings.METRICS
    if not choice:
        return None
    try:
        adapter = import_string(ADAPTERS.get(choice, choice))
    except ImportError as error:
        raise OutboxConfigurationError(
            f"OUTBOX_METRICS = {choice!r} cannot be loaded ({error}). Use one of "
            f"{', '.join(map(repr, ADAPTERS))} with its library installed "
            "(e.g. pip install 'django-outboxes[prometheus]'), or the dotted path of a "
            "Metrics subclass."
        ) from error
    if not (isinstance(adapter, type) and issubclass(adapter, Metrics)):
        raise OutboxConfigurationError(
            f"OUTBOX_METRICS = {choice!r} is not a subclass of outbox.metrics.Metrics."
        )
    return adapter()


_active: Metrics | None = None


def installed() -> Metrics | None:
    """The metrics the signal receivers feed, or None when none are installed."""
    return _active


def install(metrics: Metrics | None = None) -> Metrics | None:
    """Feed `metrics`, or else the adapter `OUTBOX_METRICS` chooses, from the signals.

    With neither, connect nothing. Calling it again without `metrics` keeps the
    metrics already installed (an adapter registers its instruments once)."""
    global _active
    if metrics is None:
        metrics = _active or build_metrics()
    if metrics is None:
        return None
    _active = metrics
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, weak=False, dispatch_uid=_uid(receiver))
    return metrics


def uninstall() -> None:
    """Disconnect the receivers; what was recorded stays recorded."""
    global _active
    _active = None
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=_uid(receiver))


def record_backlog(using: str | None = None, metrics: Metrics | None = None) -> None:
    """Report the backlog of every outbox table per scope: rows and distinct shards.

    One aggregate query per table, on `using` or the table's default database. Scopes
    reported before and now empty are reported as 0. Nothing happens (no query) when
    no metrics are installed and none are given."""
    metrics = metrics or _active
    if metrics is None:
        return
    for model in outbox_models():
        table = _table(model)
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


def _table(model: type[Any]) -> str:
    return str(model._meta.label)


def _reporting(receiver: Callable[..., None]) -> Callable[..., None]:
    """Run `receiver` only while metrics are installed; log its errors, never raise them:
    a metrics backend that is down must not fail a delivery."""

    def guarded(sender: Any, **kwargs: Any) -> None:
        metrics = _active
        if metrics is None:
            return
        try:
            receiver(metrics, _table(sender), **kwargs)
        except Exception:
            logger.exception("Recording outbox metrics failed", extra={"event": "outbox.metrics"})

    guarded.__name__ = receiver.__name__
    return guarded


@_reporting
def _on_saved(metrics: Metrics, table: str, *, rows: list[OutboxBase], **kwargs: Any) -> None:
    written = Counter((row.shard_scope, row.category) for row in rows)
    for (scope, category), count in written.items():
        metrics.saved(table, registry.scope_name(scope), registry.category_name(category), count)


@_reporting
def _on_processed(
    metrics: Metrics,
    table: str,
    *,
    shard: ShardKey,
    category: int,
    rows: int | Sized = 1,
    lag_seconds: float | None = None,
    duration_seconds: float = 0.0,
    receiver_seconds: dict[str, float] | None = None,
    **kwargs: Any,
) -> None:
    retired = rows if isinstance(rows, int) else len(rows)
    scope, category_name = registry.scope_name(shard.shard_scope), registry.category_name(category)
    metrics.processed(table, scope, category_name, retired, lag_seconds, duration_seconds)
    for receiver, seconds in (receiver_seconds or {}).items():
        metrics.receiver_finished(table, scope, category_name, receiver, seconds)


@_reporting
def _on_claimed(
    metrics: Metrics, table: str, *, shards: int, duration_seconds: float, **kwargs: Any
) -> None:
    metrics.claimed(table, shards, duration_seconds)


@_reporting
def _on_failed(
    metrics: Metrics, table: str, *, shard: ShardKey, category: int, **kwargs: Any
) -> None:
    metrics.failed(table, registry.scope_name(shard.shard_scope), registry.category_name(category))


@_reporting
def _on_dead_lettered(
    metrics: Metrics, table: str, *, shard: ShardKey, category: int, **kwargs: Any
) -> None:
    metrics.dead_lettered(
        table, registry.scope_name(shard.shard_scope), registry.category_name(category)
    )


@_reporting
def _on_lease_lost(metrics: Metrics, table: str, *, shard: ShardKey, **kwargs: Any) -> None:
    metrics.lease_lost(table, registry.scope_name(shard.shard_scope))


_RECEIVERS: tuple[tuple[Signal, Callable[..., None]], ...] = (
    (messages_saved, _on_saved),
    (message_processed, _on_processed),
    (delivery_failed, _on_failed),
    (message_dead_lettered, _on_dead_lettered),
    (lease_lost, _on_lease_lost),
    (shards_claimed, _on_claimed),
)


def _uid(receiver: Callable[..., None]) -> str:
    return f"outbox.metrics.{receiver.__name__}"
