"""The drain engine. Entry points (command, tasks, on_commit flush) all call into here."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from django.apps import apps

from outbox.engine.stats import DrainStats
from outbox.engine.worker import Drainer
from outbox.models import OutboxBase
from outbox.shards import ShardKey


def outbox_models() -> list[type[OutboxBase]]:
    """Every installed concrete outbox table."""
    return [
        model
        for model in apps.get_models()
        if issubclass(model, OutboxBase) and not model._meta.proxy
    ]


def drain_outboxes(
    models: list[type[OutboxBase]] | None = None,
    *,
    using: str | None = None,
    scopes: list[int] | None = None,
    identifiers: list[int] | None = None,
    deadline: float | None = None,
    stop: threading.Event | None = None,
) -> DrainStats:
    """Drain every due shard of the given tables (all of them by default) once."""
    stats = DrainStats()
    for model in models or outbox_models():
        drainer = Drainer(model, using, scopes=scopes, identifiers=identifiers, stop=stop)
        result = drainer.drain(deadline=deadline)
        stats.add(result)
        stats.seconds += result.seconds
    return stats


def flush_shards(
    using: str, bounds: Mapping[type[OutboxBase], Mapping[ShardKey, int | None]]
) -> DrainStats:
    """Synchronous flush after a commit: deliver the written shards up to their bounds."""
    stats = DrainStats()
    for model, shard_bounds in bounds.items():
        result = Drainer(model, using).flush(shard_bounds)
        stats.add(result)
        stats.seconds += result.seconds
    return stats


__all__ = ["DrainStats", "Drainer", "drain_outboxes", "flush_shards", "outbox_models"]
