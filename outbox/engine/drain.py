"""The engine's two calls: `drain_outboxes()`, one drain of every due shard in the
calling thread, and `flush_shards()`, the synchronous flush after a commit (which
`OutboxConfig.flush` calls for the write path, `outbox.writes.hooks`, so the write path
never imports the engine)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from outbox.engine.rounds import DrainStats
from outbox.engine.slots import SlotPool
from outbox.engine.stragglers import KeptStragglers
from outbox.engine.table import Drainer
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey


def drain_outboxes(
    models: Sequence[type[OutboxBase]] | None = None,
    *,
    using: str | None = None,
    scopes: Sequence[int] | None = None,
    identifiers: Sequence[int] | None = None,
    deadline: float | None = None,
    stop: threading.Event | None = None,
    concurrency: int | None = None,
    slots: SlotPool | None = None,
    stragglers: KeptStragglers | None = None,
) -> DrainStats:
    """Drain every due shard of the given tables (all of them by default) once, in the
    calling thread: no signals, no graceful timeout (a backlog's settles may run on a
    helper thread meanwhile; all are done on return). `concurrency`: how many shards
    are delivered at once (default `OUTBOX_CONCURRENCY`); `slots`: a pool of slot
    threads the caller keeps across drains instead (`DrainWorker` does), and `stragglers`
    the calls it lets run on them past a drain (not waited for here)."""
    stats = DrainStats()
    for model in models or outbox_models():
        drainer = Drainer(
            model,
            using,
            scopes=scopes,
            identifiers=identifiers,
            stop=stop,
            concurrency=concurrency,
            slots=slots,
            stragglers=stragglers,
        )
        result = drainer.drain(deadline=deadline)
        stats.add(result)
        stats.seconds += result.seconds
    return stats


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
