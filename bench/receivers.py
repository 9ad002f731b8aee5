"""Trivial receivers: they only count their calls, so the engine's own cost is measured.

The sync-flush receiver also notes when it was called (`time.perf_counter`, the same
clock the writer reads just before its transaction commits).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from bench.outboxes import BenchCategory
from outbox.signals import process_region_outbox

calls: Counter[int] = Counter()
sync_flush_calls: list[float] = []

DRAINED = (
    BenchCategory.AUDIT_EVENT,
    BenchCategory.STREAM_UPDATE,
    BenchCategory.OBJECT_UPDATE,
    BenchCategory.ITEM_UPDATE,
)


def count_call(sender: BenchCategory, **kwargs: Any) -> None:
    """The receiver of every drained bench category: one counter increment."""
    calls[int(sender)] += 1


def note_sync_flush(sender: BenchCategory, **kwargs: Any) -> None:
    """The receiver of the sync-flush category: when it ran."""
    sync_flush_calls.append(time.perf_counter())


for _category in DRAINED:
    process_region_outbox.connect(count_call, sender=_category, weak=False)
process_region_outbox.connect(note_sync_flush, sender=BenchCategory.SYNC_FLUSH, weak=False)


def total_calls() -> int:
    return sum(calls.values())
