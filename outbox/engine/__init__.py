"""The drain engine. Entry points (command, tasks) run `DrainWorker`; the write path's
flush hook is `flush_shards`; both deliver through the per-table `Drainer`."""

from outbox.engine.drain import Drainer, drain_outboxes, flush_shards
from outbox.engine.pipeline import DrainOutcome, DrainStats, StopRequest
from outbox.engine.worker import DrainWorker
from outbox.models import outbox_models

__all__ = [
    "DrainOutcome",
    "DrainStats",
    "DrainWorker",
    "Drainer",
    "StopRequest",
    "drain_outboxes",
    "flush_shards",
    "outbox_models",
]
