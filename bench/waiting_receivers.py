"""Receivers that wait, for the "Receivers that wait" section (`bench.waiting`).

Each message's payload says how long its receiver waits: `{"seq": n, "sleep": s}`, or
`{"seq": n, "hang": s}` for a call that hangs (it waits on `hang_released`, so the
process can let it go once its drain is over instead of sitting out the hang). `seq`
is the message's position in its shard, so the order of a shard's calls can be checked.

Every call is recorded as `[shard, object, seq, started, finished]` (`time.perf_counter`,
CLOCK_MONOTONIC, one clock for every process of the machine; `finished` is None while
the call runs): the section counts calls per (shard, object) to find lost and duplicate
deliveries, and orders each shard's calls by start to check its order. procrastinate's
task of the section (`bench.tasks.wait`) calls `wait_sync` too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from bench.outboxes import BenchCategory
from outbox.signals import process_region_outbox

hang_released = threading.Event()
_lock = threading.Lock()
_records: list[list[Any]] = []


def _start(shard: int, obj: int, payload: dict[str, Any]) -> list[Any]:
    record = [shard, obj, int(payload["seq"]), time.perf_counter(), None]
    with _lock:
        _records.append(record)
    return record


def take_records() -> list[list[Any]]:
    """The calls recorded so far (copies), forgetting them."""
    with _lock:
        taken = [list(record) for record in _records]
        _records.clear()
    return taken


def wait_sync(
    sender: Any, shard_identifier: int, object_identifier: int, payload: Any, **kwargs: Any
) -> None:
    """The sync receiver: sleeps as long as its payload says (a blocking call)."""
    record = _start(shard_identifier, object_identifier, payload)
    if "hang" in payload:
        hang_released.wait(float(payload["hang"]))
    else:
        time.sleep(float(payload["sleep"]))
    record[4] = time.perf_counter()


async def wait_async(
    sender: Any, shard_identifier: int, object_identifier: int, payload: Any, **kwargs: Any
) -> None:
    """The `async def` receiver: awaits `asyncio.sleep` as long as its payload says."""
    record = _start(shard_identifier, object_identifier, payload)
    await asyncio.sleep(float(payload["sleep"]))
    record[4] = time.perf_counter()


process_region_outbox.connect(wait_sync, sender=BenchCategory.WAIT_SYNC, weak=False)
process_region_outbox.connect(wait_async, sender=BenchCategory.WAIT_ASYNC, weak=False)
