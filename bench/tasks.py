"""The procrastinate tasks of the benchmark: as trivial as the outbox receivers, and one
that waits like the receivers of the "Receivers that wait" section.

Found by procrastinate's Django integration (it imports each app's `tasks` module).
Sync tasks, like the outbox receivers and like most Django users' tasks.
"""

from __future__ import annotations

from typing import Any

from procrastinate.contrib.django import app

QUEUE = "bench"
WAIT_QUEUE = "bench_wait"
calls = 0


@app.task(name="bench.deliver", queue=QUEUE)
def deliver(object_identifier: int, shard_identifier: int, shard_scope: int, payload: Any) -> None:
    """Count the call; nothing else."""
    global calls
    calls += 1


@app.task(name="bench.wait", queue=WAIT_QUEUE)
def wait(object_identifier: int, shard_identifier: int, shard_scope: int, payload: Any) -> None:
    """Sleep as long as the payload says and record the call, as the section's sync
    outbox receiver does (`bench.waiting_receivers.wait_sync`)."""
    from bench.waiting_receivers import wait_sync

    wait_sync(
        None,
        shard_identifier=shard_identifier,
        object_identifier=object_identifier,
        payload=payload,
    )
