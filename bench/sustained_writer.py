"""The writers of the sustained section, run in worker processes (`bench.workers`).

Each commits one message per transaction with `outbox_context(transaction.atomic(),
flush=False)`, so the drain process delivers it, and notes `time.time()` as the commit
returns. Consecutive messages of all writers go to consecutive shards, over `shards`
shards (one message per shard). With a `rate`, the writers pace themselves on a fixed
schedule (`writers / rate` seconds apart each); without one they write flat out.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

# object_identifier = tag + writer index << WRITER_BITS + n: unique across a section run.
WRITER_BITS = 32


def write(
    budget: float, writers: int, shards: int, tag: int, rate: float | None = None
) -> dict[str, Any]:
    from django.db import transaction

    from bench.outboxes import BenchCategory, BenchScope
    from outbox import outbox_context
    from outbox.models import RegionOutbox

    index = _worker_index()
    spacing = writers / rate if rate else 0.0
    commits: list[tuple[int, float]] = []
    start = time.perf_counter()
    n = 0
    while True:
        now = time.perf_counter()
        if spacing:
            due = start + n * spacing
            if due > now:
                time.sleep(due - now)
                now = time.perf_counter()
        if now - start >= budget:
            break
        identifier = tag + (index << WRITER_BITS) + n
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutbox(
                shard_scope=BenchScope.AUDIT,
                shard_identifier=(n * writers + index) % shards + 1,
                category=BenchCategory.AUDIT_EVENT,
                object_identifier=identifier,
                payload={"n": n},
            ).save()
        commits.append((identifier, time.time()))
        n += 1
    return {"messages": n, "commits": commits}


def _worker_index() -> int:
    """This writer's index: `bench.workers` gives every worker the same keyword
    arguments, and names worker `i` of a run `bench-<function>-<i>`."""
    return int(multiprocessing.current_process().name.rpartition("-")[2])
