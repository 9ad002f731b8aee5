"""The synchronous flush: after a commit, deliver the shards it wrote, up to their bounds.

`OutboxConfig.ready` installs `flush_shards` as the write path's flush hook
(`outbox.writes.hooks`), so the write path never imports the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from outbox.engine.drainer import Drainer
from outbox.engine.stats import DrainStats
from outbox.models import OutboxBase
from outbox.shards import ShardKey


def flush_shards(
    using: str, bounds: Mapping[type[OutboxBase], Mapping[ShardKey, int | None]]
) -> DrainStats:
    """Deliver the written shards up to their bounds (the highest row id the transaction
    wrote per shard; None: no bound). A shard another worker holds is left to it."""
    stats = DrainStats()
    for model, shard_bounds in bounds.items():
        result = Drainer(model, using).flush(shard_bounds)
        stats.add(result)
        stats.seconds += result.seconds
    return stats
