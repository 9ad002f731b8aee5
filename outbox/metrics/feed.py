"""The installed metrics, and the lifecycle-signal receivers that feed them.

`install()` connects the receivers; with no metrics to install it connects nothing, so
the engine's `has_listeners()` checks skip the signals and metrics cost nothing. A
process that installed metrics withdraws its gauges as it exits (`Metrics.process_ended`,
at interpreter exit; a Celery pool process, which leaves without it, at
``worker_process_shutdown``).
"""

from __future__ import annotations

import atexit
import logging
from collections import Counter
from collections.abc import Callable, Sized
from typing import Any

from django.dispatch import Signal

from outbox.categories import registry
from outbox.metrics.base import Metrics, build_metrics, table_label
from outbox.models import OutboxBase
from outbox.shards import ShardKey
from outbox.signals import (
    delivery_failed,
    lease_lost,
    message_dead_lettered,
    message_processed,
    messages_saved,
    receivers_stuck,
    shards_claimed,
)

__all__ = ["install", "installed", "process_ended", "uninstall"]

# The package's name, not this module's: operators route and silence "outbox.metrics".
logger = logging.getLogger("outbox.metrics")

_active: Metrics | None = None
_exit_hooked = False


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
    _hook_exit()
    return metrics


def process_ended() -> None:
    """Withdraw this process's gauges from the installed metrics (see
    `Metrics.process_ended`): it is exiting. Errors are logged, never raised."""
    metrics = _active
    if metrics is None:
        return
    try:
        metrics.process_ended()
    except Exception:
        logger.exception("Withdrawing the outbox gauges failed", extra={"event": "outbox.metrics"})


def _hook_exit() -> None:
    """Call `process_ended` at interpreter exit, once per process (a forked child inherits
    the hook, and withdraws its own gauges: the adapter takes the pid as it runs)."""
    global _exit_hooked
    if not _exit_hooked:
        atexit.register(process_ended)
        _exit_hooked = True


def uninstall() -> None:
    """Disconnect the receivers; what was recorded stays recorded."""
    global _active
    _active = None
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=_uid(receiver))


def _reporting(receiver: Callable[..., None]) -> Callable[..., None]:
    """Run `receiver` only while metrics are installed; log its errors, never raise them:
    a metrics backend that is down must not fail a delivery."""

    def guarded(sender: Any, **kwargs: Any) -> None:
        metrics = _active
        if metrics is None:
            return
        try:
            receiver(metrics, table_label(sender), **kwargs)
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


@_reporting
def _on_receivers_stuck(metrics: Metrics, table: str, *, count: int, **kwargs: Any) -> None:
    metrics.stuck_receivers(table, count)


_RECEIVERS: tuple[tuple[Signal, Callable[..., None]], ...] = (
    (messages_saved, _on_saved),
    (message_processed, _on_processed),
    (delivery_failed, _on_failed),
    (message_dead_lettered, _on_dead_lettered),
    (lease_lost, _on_lease_lost),
    (shards_claimed, _on_claimed),
    (receivers_stuck, _on_receivers_stuck),
)


def _uid(receiver: Callable[..., None]) -> str:
    return f"outbox.metrics.{receiver.__name__}"
