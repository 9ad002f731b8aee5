"""The drain engine. Entry points (command, tasks, on_commit flush) all call into here."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from outbox.engine.drainer import Drainer
from outbox.engine.stats import DrainStats
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey


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
