"""`drain_outboxes()`: one drain of every due shard, in the calling thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from outbox.engine.drainer import Drainer
from outbox.engine.slots import SlotPool
from outbox.engine.stats import DrainStats
from outbox.models import OutboxBase, outbox_models


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
) -> DrainStats:
    """Drain every due shard of the given tables (all of them by default) once, in the
    calling thread: no signals, no graceful timeout (a backlog's settles may run on a
    helper thread meanwhile; all are done on return). `concurrency`: how many shards
    are delivered at once (default `OUTBOX_CONCURRENCY`); `slots`: a pool of slot
    threads the caller keeps across drains instead (`DrainWorker` does)."""
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
        )
        result = drainer.drain(deadline=deadline)
        stats.add(result)
        stats.seconds += result.seconds
    return stats
