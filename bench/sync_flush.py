"""(h) Synchronous flush latency: from the end of the writer's block to its receiver.

Each iteration writes one RegionOutbox row inside
`with outbox_context(transaction.atomic()):` and reads `time.perf_counter()` as the last
statement of the block; leaving the block commits, and the engine's on_commit flush
calls the receiver, which notes `time.perf_counter()` too (`bench.receivers`). The
difference is commit + flush: find the shard, lease it, read, call. Shards rotate over
100 identifiers; every flush must have delivered its row before the next iteration.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def measure(iterations: int, warmup: int = 10) -> dict[str, Any]:
    from django.db import transaction

    from bench import receivers
    from bench.db import outbox_rows, reset
    from bench.outboxes import BenchCategory, BenchScope
    from outbox import outbox_context
    from outbox.models import RegionOutbox

    reset()
    calls = receivers.sync_flush_calls
    calls.clear()
    latencies: list[float] = []
    for i in range(warmup + iterations):
        with outbox_context(transaction.atomic()):
            RegionOutbox(
                shard_scope=BenchScope.SYNC,
                shard_identifier=i % 100 + 1,
                category=BenchCategory.SYNC_FLUSH,
                object_identifier=i,
                payload={"iteration": i},
            ).save()
            before = time.perf_counter()
        if len(calls) != i + 1:
            raise RuntimeError(f"sync flush {i}: receiver called {len(calls)} times, not {i + 1}")
        if i >= warmup:
            latencies.append(calls[-1] - before)
    left = outbox_rows()
    if left:
        raise RuntimeError(f"sync flush left {left} rows behind")
    ms = [value * 1000 for value in latencies]
    return {
        "iterations": iterations,
        "p50_ms": statistics.median(ms),
        "p90_ms": _percentile(ms, 0.90),
        "p99_ms": _percentile(ms, 0.99),
        "max_ms": max(ms),
        "mean_ms": statistics.fmean(ms),
    }
