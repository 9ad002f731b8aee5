"""The procrastinate task of the benchmark: as trivial as the outbox receivers.

Found by procrastinate's Django integration (it imports each app's `tasks` module).
A sync task, like the outbox receivers and like most Django users' tasks.
"""

from __future__ import annotations

from typing import Any

from procrastinate.contrib.django import app

QUEUE = "bench"
calls = 0


@app.task(name="bench.deliver", queue=QUEUE)
def deliver(object_identifier: int, shard_identifier: int, shard_scope: int, payload: Any) -> None:
    """Count the call; nothing else."""
    global calls
    calls += 1
