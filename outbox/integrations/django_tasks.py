"""Draining with Django's Tasks framework (Django 6): no Celery needed.

The same drain as the Celery integration, as Django Tasks on the backend and queue of
OUTBOX_TASKS_BACKEND and OUTBOX_TASKS_QUEUE_NAME:

- `schedule_drains`: reserve due shards and enqueue `drain_shards` tasks for them;
  enqueue it periodically with whatever scheduler the project has.
- `drain_shards`: drain the given shards of one table.
- `drain_all`: drain every due shard of every table, within OUTBOX_TASK_SECONDS.
- `prompt_drain`: the OUTBOX_PROMPT_DRAIN hook enqueuing `drain_shards` after a commit.

Tasks are run under `outbox.integrations.graceful`: a worker that runs them in its main
thread and gets SIGTERM or SIGINT during one finishes the receiver in flight, releases
its leases, then lets the worker's own handler run. Importing this module needs
Django 6 (`django.tasks`); nothing else in the app imports it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.tasks import Task, TaskResult, task

from outbox.conf import outbox_settings
from outbox.integrations import graceful

if TYPE_CHECKING:
    from outbox.engine import DrainStats
    from outbox.models import OutboxBase
    from outbox.shards import ShardKey


def enqueue(task: Task[Any, Any], *args: Any) -> TaskResult[Any, Any]:
    """Enqueue an outbox task on OUTBOX_TASKS_BACKEND and OUTBOX_TASKS_QUEUE_NAME as they
    are set now (the decorators below only give the defaults at import)."""
    configured = task.using(
        backend=str(outbox_settings.TASKS_BACKEND),
        queue_name=str(outbox_settings.TASKS_QUEUE_NAME),
    )
    return configured.enqueue(*args)


_BACKEND = str(outbox_settings.TASKS_BACKEND)
_QUEUE_NAME = str(outbox_settings.TASKS_QUEUE_NAME)


@task(backend=_BACKEND, queue_name=_QUEUE_NAME)
def schedule_drains() -> int:
    """Reserve due shards of every outbox table and enqueue drain tasks for them."""
    from outbox.integrations.dispatch import plan_drains

    orders = plan_drains()
    for order in orders:
        enqueue(drain_shards, *order.as_args())
    return len(orders)


@task(backend=_BACKEND, queue_name=_QUEUE_NAME)
def drain_shards(
    table: str, using: str, shards: Sequence[Sequence[Any]], reservation: str | None = None
) -> dict[str, Any]:
    """Drain the given shards of one table."""
    from outbox.integrations.dispatch import DrainOrder, run_order

    order = DrainOrder.from_args(table, using, shards, reservation)
    return _supervised(lambda stop: run_order(order, stop))


@task(backend=_BACKEND, queue_name=_QUEUE_NAME)
def drain_all() -> dict[str, Any]:
    """Drain every due shard of every outbox table, within OUTBOX_TASK_SECONDS."""
    from outbox.integrations import dispatch

    return _supervised(dispatch.drain_all)


def prompt_drain(using: str, shards: Mapping[type[OutboxBase], Collection[ShardKey]]) -> None:
    """OUTBOX_PROMPT_DRAIN hook: enqueue a drain of the shards a commit just wrote."""
    from outbox.integrations.dispatch import prompt_orders

    for order in prompt_orders(using, shards):
        enqueue(drain_shards, *order.as_args())


def _supervised(target: Callable[[threading.Event], DrainStats]) -> dict[str, Any]:
    from outbox.integrations.dispatch import stats_summary

    with _graceful_signals():
        outcome = graceful.run_gracefully(target, name="outbox-drain")
    if not outcome.finished or outcome.result is None:
        return {"abandoned": True}
    return stats_summary(outcome.result)


@contextmanager
def _graceful_signals() -> Iterator[None]:
    """In the main thread, SIGTERM/SIGINT first stop the drain, then reach the worker."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in signums}
    pending: list[signal.Signals] = []

    def stop_drain(signum: int, frame: Any) -> None:
        graceful.request_shutdown()
        pending.append(signal.Signals(signum))

    for signum in signums:
        signal.signal(signum, stop_drain)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        graceful.reset()
        # The worker's own handler runs once the drain has stopped: it then sees no task
        # running and shuts down as it would have.
        for received in pending[:1]:
            handler = previous[received]
            if callable(handler):
                handler(received, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(received)
