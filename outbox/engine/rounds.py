"""Helpers of a drain round that need no drainer state."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from outbox.backends.base import Lease, OutboxBackend, Window
from outbox.backends.errors import is_transient_lock_error
from outbox.conf import outbox_settings
from outbox.engine.stats import DrainStats
from outbox.models import OutboxBase
from outbox.shards import ShardKey

_T = TypeVar("_T")

logger = logging.getLogger("outbox.engine")


def retrying(operation: Callable[[], _T]) -> _T:
    """Run a short engine statement, retrying deadlocks and lock timeouts."""
    for attempt in range(5):
        try:
            return operation()
        except Exception as exc:
            if attempt == 4 or not is_transient_lock_error(exc):
                raise
            time.sleep(0.01 * 2**attempt)
    raise AssertionError("unreachable")


def release_quietly(backend: OutboxBackend, model: type[OutboxBase], lease: Lease) -> bool:
    """Release the lease's shards, retrying lock errors; False, with a warning logged,
    if that failed: the leases expire by themselves, and the error that brought the
    caller here matters more."""
    try:
        retrying(lambda: backend.release(model, lease, lease.shards))
    except Exception:
        logger.warning("outbox could not release leases %s", lease.token, exc_info=True)
        return False
    return True


def cut_at_bounds(window: Window, bounds: Mapping[ShardKey, int | None]) -> set[ShardKey]:
    """A flush delivers the groups whose oldest pending row is at most its shard's bound
    (the newest row its transaction wrote), each with its newest payload even when that
    row came later; it stops at the first group that began after the bound, so a busy
    shard cannot keep the request flushing. Returns the shards cut there: done."""
    reached = set()
    for shard, groups in window.shards.items():
        bound = bounds.get(shard)
        if bound is None:
            continue
        for index, group in enumerate(groups):
            if group.row_ids[0] > bound:
                del groups[index:]
                reached.add(shard)
                break
    return reached


def done_shards(
    active: Sequence[ShardKey], window: Window, reached: set[ShardKey], failed: set[ShardKey]
) -> list[ShardKey]:
    """The shards a round finished: read to their end (or to a flush's bound) and not
    failed; release them."""
    return [
        key
        for key in active
        if (key not in window.incomplete or key in reached) and key not in failed
    ]


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
