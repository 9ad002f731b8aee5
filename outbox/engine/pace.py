"""How many shards a drain claims: about as many as it can deliver soon.

Shards a worker has claimed wait for it, however slow its receivers are, while other
workers find nothing to claim. So a drain claims what its slots deliver in about
`BATCH_TARGET_SECONDS`, judged by how long its last batch took per shard, within the
row-count budget (`OUTBOX_BATCH_SHARDS`, `OUTBOX_BATCH_ROWS`). Its first claim, before it
has seen a receiver, is small (`FIRST_CLAIM_PER_SLOT` shards per slot): fast receivers
lose one round trip to it, slow ones leave the rest of the shards to other workers.
"""

from __future__ import annotations

from outbox.conf import outbox_settings
from outbox.engine.rounds import DrainStats

BATCH_TARGET_SECONDS = 1.0
FIRST_CLAIM_PER_SLOT = 16


class Pace:
    """One drain's claim size, from the time its batches took per shard."""

    def __init__(self) -> None:
        self.seconds_per_shard: float | None = None  # wall time, slots working at once

    def observe(self, batch: DrainStats, seconds: float) -> None:
        if batch.shards and batch.receiver_calls:
            self.seconds_per_shard = seconds / batch.shards

    def limit(self, budget: int, concurrency: int) -> int:
        """How many shards the next claim takes, at most `budget`, at least one per slot."""
        per_shard = self.seconds_per_shard
        if per_shard is None:
            return min(budget, FIRST_CLAIM_PER_SLOT * concurrency)
        fits = int(BATCH_TARGET_SECONDS / per_shard) if per_shard > 0 else budget
        return max(min(budget, fits), min(budget, concurrency), 1)


def shard_budget(wide_batches: bool, batch: DrainStats) -> int:
    """How many shards the next batch claims: OUTBOX_BATCH_SHARDS; or, on a backend
    whose steps cost one statement each whatever the shard count (`wide_batches`), as
    many shards as fill a window of OUTBOX_BATCH_ROWS at the last batch's rows per shard
    (one message per shard: up to OUTBOX_BATCH_ROWS shards), so small shards cost no
    more round trips per message than big ones."""
    shards = outbox_settings.BATCH_SHARDS
    if not wide_batches or not batch.shards:
        return shards
    per_shard = max(rows_per_shard(batch), 1.0)
    return max(shards, min(outbox_settings.BATCH_ROWS, int(outbox_settings.BATCH_ROWS / per_shard)))


def rows_per_shard(batch: DrainStats) -> float:
    """The rows a batch worked on (retired, failed or dead-lettered) per shard it claimed."""
    rows = batch.rows_retired + batch.failures + batch.dead_lettered
    return rows / batch.shards if batch.shards else 0.0
