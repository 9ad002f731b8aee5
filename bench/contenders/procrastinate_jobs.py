"""(c) procrastinate, used the way its Django users would: one job per message.

Each message becomes one job of a trivial sync task (`bench.tasks.deliver`), deferred
through procrastinate's Django integration, so the insert runs on Django's connection
inside `transaction.atomic()` (the model's transaction). Setup defers the jobs in
chunks, one transaction per chunk (not measured).

Two variants. Without a lock (contender `procrastinate`): one worker runs jobs in id
order anyway, so this keeps shard order with one worker, and is procrastinate's fastest
setup. With `lock` = the shard (`procrastinate_lock`): procrastinate's way to keep one
shard's jobs in order across several workers, which is what the outbox guarantees; its
fetch then checks the lock against every other job, a cost that grows with the backlog.

Measured: the drain only. One worker (`concurrency=1`, like one drain process),
`wait=False` so it stops once the queue is empty, `delete_jobs="successful"` so finished
jobs are deleted like delivered outbox rows. There is no coalescing: every message runs.

`defer_messages` and `work` also serve the "Receivers that wait" section
(`bench.waiting`), with its waiting task and a worker `concurrency` above 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

DEFER_CHUNK = 2000


def available() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "HAS_PROCRASTINATE", False))


def defer_shape(shape: Any, lock: bool) -> int:
    """Defer one job per message of `shape` (setup, in the parent process)."""
    from bench.tasks import deliver

    return defer_messages(deliver, shape.messages(), lock)


def defer_messages(task: Any, messages: Iterable[dict[str, Any]], lock: bool = False) -> int:
    """Defer one job of `task` per message (its keyword arguments), `DEFER_CHUNK` jobs
    per transaction; with `lock`, each job's lock is its shard."""
    from django.db import transaction
    from procrastinate.contrib.django import app

    deferred = 0
    chunk: list[Any] = []

    def flush() -> None:
        with transaction.atomic():
            app.job_manager.batch_defer_jobs(chunk)

    for message in messages:
        shard = f"{message['shard_scope']}:{message['shard_identifier']}"
        chunk.append(task.configure(lock=shard if lock else None).make_new_job(**message))
        if len(chunk) >= DEFER_CHUNK:
            flush()
            deferred += len(chunk)
            chunk = []
    if chunk:
        flush()
        deferred += len(chunk)
    return deferred


def remaining_jobs() -> dict[str, int]:
    """Jobs left by status (a finished drain leaves none: successful ones are deleted)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM procrastinate_jobs GROUP BY status")
        return {str(status): int(count) for status, count in cursor.fetchall()}


def run(budget: float) -> dict[str, Any]:
    """Run one worker until the queue is empty or `budget` runs out (in a bench worker)."""
    from bench import tasks

    complete = work(budget, tasks.QUEUE, concurrency=1)
    return {"receiver_calls": tasks.calls, "rows_retired": tasks.calls, "complete": complete}


def work(budget: float, queue: str, concurrency: int) -> bool:
    """One worker with `concurrency` on `queue` until it is empty (True) or `budget`
    runs out (False)."""
    from procrastinate.contrib.django import app

    async def serve() -> bool:
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[queue],
                    concurrency=concurrency,
                    wait=False,
                    delete_jobs="successful",
                    install_signal_handlers=False,
                )
            )
            done, _ = await asyncio.wait([worker], timeout=budget)
            if done:
                worker.result()
                return True
            # Out of budget: cancelling asks the worker for a graceful stop.
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(worker, 30.0)
            return False

    # As `manage.py procrastinate worker` does: the worker gets its own async connector.
    with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
        return asyncio.run(serve())
