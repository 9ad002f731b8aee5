"""How many shards a drain claims: about as many as it can deliver soon.

Shards a worker has claimed wait for it, however slow its receivers are, while other
workers find nothing to claim. So a drain claims what its slots deliver in about
`BATCH_TARGET_SECONDS`, judged by how long its last batch took per shard, within the
row-count budget (`OUTBOX_BATCH_SHARDS`, `OUTBOX_BATCH_ROWS`). Its first claim, before it
has seen a receiver, is small (`FIRST_CLAIM_PER_SLOT` shards per slot): fast receivers
lose one round trip to it, slow ones leave the rest of the shards to other workers.
"""

from __future__ import annotations

from outbox.engine.stats import DrainStats

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
