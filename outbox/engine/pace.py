"""How many shards a drain claims at once: about what it delivers in a moment.

Two reasons to keep a batch short in time. Shards a worker has claimed wait for it,
however slow its receivers are, while other workers find nothing to claim. And rows a
worker has delivered are deleted when their round is settled: if the worker dies first,
they are delivered again. Through a backlog a worker has two rounds unsettled at most
(the one it delivers, and the one settling behind it), so each is kept to half of
`OUTBOX_UNSETTLED_SECONDS` when receivers wait (calls of `WAITING_CALL_SECONDS` or more):
a drain claims the shards its slots deliver in that time, judged by its last batch, in
whole rounds of its slots, within the row-count budget (`OUTBOX_BATCH_SHARDS`,
`OUTBOX_BATCH_ROWS`) and never fewer than one shard per slot. Receivers that return at
once fill the budget long before, so for them a batch may take up to
`FAST_BATCH_SECONDS`, and the statements per message stay what they were. Windows are
not shortened: a group is delivered with the newest row its window read, so a window
cut short would deliver a group twice in one pass. A first claim, before the drain has
seen a receiver, is small (`FIRST_CLAIM_PER_SLOT` shards per slot, at least
`FIRST_CLAIM_LEAST`): fast receivers lose a round trip or two to it, slow ones leave the
rest of the shards to other drains started at the same moment, which would otherwise
find every shard taken and end (the bench's "Receivers that wait" section measures it).
"""

from __future__ import annotations

from outbox.conf import outbox_settings
from outbox.engine.rounds import DrainStats

FIRST_CLAIM_PER_SLOT = 4
FIRST_CLAIM_LEAST = 16
# How long a batch of receivers that return at once may take: the bound on unsettled
# work is for receivers that wait, and fast ones fill the row budget well inside it.
FAST_BATCH_SECONDS = 1.0
# Receivers that wait: calls of a millisecond or more on average.
WAITING_CALL_SECONDS = 0.001


class Pace:
    """One drain's claim size, from the time its last batch took per shard."""

    def __init__(self) -> None:
        self.seconds_per_shard: float | None = None  # wall time, slots working at once
        self.waiting = False  # the last batch's receivers waited (see the module)

    def observe(self, batch: DrainStats, seconds: float, call_seconds: float | None) -> None:
        """A batch took `seconds`, its receiver calls `call_seconds` each on average."""
        if batch.shards and batch.receiver_calls:
            self.seconds_per_shard = seconds / batch.shards
            self.waiting = call_seconds is not None and call_seconds >= WAITING_CALL_SECONDS

    def target_seconds(self) -> float:
        """How long one batch should take to deliver."""
        if self.waiting:
            return outbox_settings.UNSETTLED_SECONDS / 2
        return FAST_BATCH_SECONDS

    def limit(self, budget: int, concurrency: int) -> int:
        """How many shards the next claim takes: at most `budget`, but at least one per
        slot whatever the budget, so that every slot has a shard to deliver (with
        `async def` receivers, hundreds of calls may wait at once)."""
        budget = max(budget, concurrency)
        per_shard = self.seconds_per_shard
        if per_shard is None:
            return min(budget, max(FIRST_CLAIM_LEAST, FIRST_CLAIM_PER_SLOT * concurrency))
        fits = int(self.target_seconds() / per_shard) if per_shard > 0 else budget
        if self.waiting and fits > concurrency:
            # Whole rounds of the slots: a last round that keeps only some of them busy
            # takes as long as a full one.
            fits -= fits % concurrency
        return max(min(budget, fits), concurrency, 1)


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


def rows_worked(batch: DrainStats) -> int:
    """The rows a batch worked on: retired, failed or dead-lettered."""
    return batch.rows_retired + batch.failures + batch.dead_lettered


def rows_per_shard(batch: DrainStats) -> float:
    """The rows a batch worked on per shard it claimed."""
    return rows_worked(batch) / batch.shards if batch.shards else 0.0
