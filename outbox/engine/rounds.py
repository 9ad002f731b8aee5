"""Helpers of a drain round that need no drainer state."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from outbox.backends.base import Window
from outbox.backends.errors import is_transient_lock_error
from outbox.shards import ShardKey

_T = TypeVar("_T")


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
