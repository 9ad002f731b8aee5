"""Trivial receivers: they only count their calls, so the engine's own cost is measured;
or, with `python -m bench --receiver kwargs` (OUTBOX_BENCH_RECEIVER), they also read every
keyword argument they get, as a receiver that uses its message does (`read_kwargs`; the
raw loops then pass their rows' columns by keyword to `read_columns`).

The sync-flush receiver also notes when it was called (`time.perf_counter`, the same
clock the writer reads just before its transaction commits).
"""

from __future__ import annotations

import os
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


def read_kwargs(sender: BenchCategory, **kwargs: Any) -> None:
    """`count_call`, having read every keyword argument it got."""
    for value in kwargs.values():
        if value is _NOTHING:
            break
    calls[int(sender)] += 1


def read_columns(**columns: Any) -> None:
    """The raw loops' call per row with `--receiver kwargs`: reads every column it got."""
    for value in columns.values():
        if value is _NOTHING:
            break


_NOTHING = object()
KWARGS = os.environ.get("OUTBOX_BENCH_RECEIVER") == "kwargs"


def note_sync_flush(sender: BenchCategory, **kwargs: Any) -> None:
    """The receiver of the sync-flush category: when it ran."""
    sync_flush_calls.append(time.perf_counter())


for _category in DRAINED:
    process_region_outbox.connect(
        read_kwargs if KWARGS else count_call, sender=_category, weak=False
    )
process_region_outbox.connect(note_sync_flush, sender=BenchCategory.SYNC_FLUSH, weak=False)


def total_calls() -> int:
    return sum(calls.values())
