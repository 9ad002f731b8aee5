"""(h) Synchronous flush latency: from the end of the writer's block to its receiver.

Each iteration writes one RegionOutbox row inside
`with outbox_context(transaction.atomic()):` and reads `time.perf_counter()` as the last
statement of the block; leaving the block commits, and the engine's on_commit flush
calls the receiver, which notes `time.perf_counter()` too (`bench.receivers`). The
difference is commit + flush: lease the shard and read it (one statement on PostgreSQL),
call. Shards rotate over 100 identifiers; every flush must have delivered its row before
the next iteration. It is measured twice: with Django's defaults, and on a connection
whose OPTIONS set `prepare_threshold` (the engine then prepares its statements, and the
claim is planned once: `outbox/backends/postgresql/backend.py`).

Its floor, measured in the same run and in alternating blocks: psycopg alone on its own
connection, the same row INSERTed and COMMITted, then the leased floor's claim + read
(`bench/contenders/raw_leased.py`: one statement that takes the lease row and reads the
row, a durable commit of its own) and the call, then its finish statement (untimed).
That is the writer's commit plus one durable commit before the receiver starts, what the
engine's flush spends at the least with its lease contract.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def measure(iterations: int, warmup: int = 10, block: int = 50) -> dict[str, Any]:
    from bench.db import outbox_rows, reset

    reset()
    runs: dict[str, Callable[[int], float]] = {
        "ours": _ours("default"),
        "prepared": _ours("prepared"),
        "floor": _floor(),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        for _ in range(warmup):
            run(0)
    done = 0
    while done < iterations:
        count = min(block, iterations - done)
        for name, run in runs.items():
            times[name] += [run(done + n) for n in range(count)]
        done += count
    left = outbox_rows()
    if left:
        raise RuntimeError(f"sync flush left {left} rows behind")
    result = _summary(times["ours"])
    result["floor"] = floor = _summary(times["floor"])
    result["prepared"] = prepared = _summary(times["prepared"])
    for figures in (result, prepared):
        figures["p50_over_floor"] = figures["p50_ms"] / floor["p50_ms"]
        figures["p99_over_floor"] = figures["p99_ms"] / floor["p99_ms"]
    return result


def _summary(seconds: list[float]) -> dict[str, Any]:
    ms = [value * 1000 for value in seconds]
    return {
        "iterations": len(ms),
        "p50_ms": statistics.median(ms),
        "p90_ms": _percentile(ms, 0.90),
        "p99_ms": _percentile(ms, 0.99),
        "max_ms": max(ms),
        "mean_ms": statistics.fmean(ms),
    }


def _ours(using: str) -> Callable[[int], float]:
    """`using`: "default" (Django's defaults) or "prepared", the same database with
    `prepare_threshold` set, so that the engine prepares its statements."""
    from django.db import transaction

    from bench import receivers
    from bench.outboxes import BenchCategory, BenchScope
    from outbox import outbox_context
    from outbox.models import RegionOutbox

    calls = receivers.sync_flush_calls
    calls.clear()

    def flush_once(i: int) -> float:
        called = len(calls)
        with outbox_context(transaction.atomic(using=using)):
            RegionOutbox(
                shard_scope=BenchScope.SYNC,
                shard_identifier=i % 100 + 1,
                category=BenchCategory.SYNC_FLUSH,
                object_identifier=i,
                payload={"iteration": i},
            ).save(using=using)
            before = time.perf_counter()
        if len(calls) != called + 1:
            raise RuntimeError(f"sync flush {i}: the receiver was not called once")
        return calls[-1] - before

    return flush_once


def _floor() -> Callable[[int], float]:
    import psycopg

    from bench.contenders.raw_leased import HOLDER, statements
    from bench.db import conninfo
    from bench.outboxes import BenchCategory, BenchScope
    from outbox.models import RegionOutbox

    claim, finish = statements()
    label = RegionOutbox._meta.label_lower
    insert = (
        f'INSERT INTO "{RegionOutbox._meta.db_table}" (shard_scope, shard_identifier, '
        "category, object_identifier, payload, attempts, last_error) "
        "VALUES (%s, %s, %s, %s, %s, 0, '')"
    )
    conn = psycopg.connect(**conninfo(), autocommit=True)

    def flush_once(i: int) -> float:
        conn.execute("BEGIN")
        scope, category = int(BenchScope.SYNC), int(BenchCategory.SYNC_FLUSH)
        conn.execute(insert, (scope, i % 100 + 1, category, i, json.dumps({"iteration": i})))
        before = time.perf_counter()
        conn.execute("COMMIT")
        token = uuid.uuid4().hex
        params = {"limit": 100, "label": label, "token": token, "holder": HOLDER}
        rows = conn.execute(claim, params).fetchall()
        started = time.perf_counter()  # where the receiver would start
        if len(rows) != 1:
            raise RuntimeError(f"sync flush floor {i}: claimed {len(rows)} rows, not 1")
        conn.execute(finish, {"token": token, "ids": [row[0] for row in rows]})
        return started - before

    return flush_once
