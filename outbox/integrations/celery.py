"""Draining with Celery: beat fans due shards out to drain tasks across workers.

Wire it into the project's Celery app::

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()
    add_beat_schedule(app)  # registers the tasks, schedules `schedule_drains`

`schedule_drains` (beat, every OUTBOX_CELERY_SCHEDULE_SECONDS) reserves due shards and
sends them out in `drain` tasks of OUTBOX_TASK_SHARDS shards each (see
`outbox.integrations.dispatch`). A `drain` task runs until its shards are done or its
OUTBOX_TASK_SECONDS budget is spent. With OUTBOX_PROMPT_DRAIN set to
``"outbox.integrations.celery.prompt_drain"``, a commit that left rows to the drain
sends a `drain` of its shards right away.

Warm shutdown (SIGTERM to the worker): every drain of the worker, in its pool processes
too, claims nothing new, finishes the receiver in flight, settles and releases its
leases, so other workers continue at once. A receiver still running after
OUTBOX_GRACEFUL_TIMEOUT_SECONDS is left behind; its lease expires.

Engine imports are deferred: the project's Celery module imports this one before
Django is set up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from celery import Celery, shared_task
from celery import signals as celery_signals

from outbox.conf import outbox_settings
from outbox.integrations import graceful

if TYPE_CHECKING:
    from outbox.integrations.dispatch import DrainOrder
    from outbox.models import OutboxBase
    from outbox.shards import ShardKey

logger = logging.getLogger("outbox.engine")

BEAT_ENTRY_NAME = "outbox-schedule-drains"
# Sent by the worker's main process to its pool processes on warm shutdown; pool
# processes take SIGTERM as "die now" (Celery's own use of it), so it cannot be that.
STOP_SIGNAL = signal.SIGUSR2


def schedule_drains() -> int:
    """Reserve due shards of every outbox table and send them out in drain tasks."""
    from outbox.integrations.dispatch import plan_drains

    orders = plan_drains()
    for order in orders:
        send(order)
    return len(orders)


def drain(
    table: str,
    using: str,
    shards: Sequence[Sequence[Any]],
    reservation: str | None = None,
) -> dict[str, Any]:
    """Drain the given shards of one table (a `DrainOrder` as task arguments)."""
    from outbox.integrations.dispatch import DrainOrder, run_order, stats_summary

    order = DrainOrder.from_args(table, using, shards, reservation)
    outcome = graceful.run_gracefully(lambda stop: run_order(order, stop), name="outbox-drain")
    if not outcome.finished or outcome.result is None:
        return {"abandoned": True}
    return stats_summary(outcome.result)


schedule_drains_task = shared_task(name=outbox_settings.CELERY_SCHEDULE_TASK, ignore_result=True)(
    schedule_drains
)
drain_task = shared_task(
    name=outbox_settings.CELERY_DRAIN_TASK,
    ignore_result=True,
    time_limit=outbox_settings.CELERY_TIME_LIMIT_SECONDS,
)(drain)


def send(order: DrainOrder) -> None:
    """Queue one drain task. It expires with its reservation: a task that waited that
    long is dropped, and a later tick hands its shards out again."""
    drain_task.apply_async(
        args=order.as_args(),
        queue=outbox_settings.CELERY_QUEUE,
        expires=float(outbox_settings.LEASE_SECONDS),
    )


def prompt_drain(using: str, shards: Mapping[type[OutboxBase], Collection[ShardKey]]) -> None:
    """OUTBOX_PROMPT_DRAIN hook: send a drain of the shards a commit just wrote."""
    from outbox.integrations.dispatch import prompt_orders

    for order in prompt_orders(using, shards):
        send(order)


def beat_schedule_entry() -> dict[str, Any]:
    """The beat entry of `schedule_drains`; a tick not run within its interval is dropped."""
    interval = float(outbox_settings.CELERY_SCHEDULE_SECONDS)
    options: dict[str, Any] = {"expires": interval}
    if outbox_settings.CELERY_QUEUE:
        options["queue"] = outbox_settings.CELERY_QUEUE
    return {"task": schedule_drains_task.name, "schedule": interval, "options": options}


def add_beat_schedule(app: Celery, name: str = BEAT_ENTRY_NAME) -> None:
    """Add the `schedule_drains` entry to the app's beat schedule (keeping the others)."""
    app.conf.beat_schedule = {**(app.conf.beat_schedule or {}), name: beat_schedule_entry()}


# Warm shutdown. The worker's main process gets the signal; drains run in its pool
# processes (prefork) or in its own threads (threads, solo pools).

_workers: list[Any] = []


def _remember_worker(sender: Any = None, **kwargs: Any) -> None:
    _workers[:] = [sender]


def _stop_on_signal_in_pool_process(**kwargs: Any) -> None:
    signal.signal(STOP_SIGNAL, lambda signum, frame: graceful.request_shutdown())


def _stop_drains_on_shutdown(**kwargs: Any) -> None:
    graceful.request_shutdown()
    for pid in _pool_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, STOP_SIGNAL)


def _pool_processes() -> list[int]:
    try:
        processes = _workers[0].pool.info.get("processes", [])
    except Exception:  # no worker, or a pool without processes
        return []
    return [pid for pid in processes if isinstance(pid, int) and pid != os.getpid()]


celery_signals.worker_init.connect(_remember_worker, dispatch_uid="outbox.remember_worker")
celery_signals.worker_process_init.connect(
    _stop_on_signal_in_pool_process, dispatch_uid="outbox.stop_on_signal"
)
celery_signals.worker_shutting_down.connect(
    _stop_drains_on_shutdown, dispatch_uid="outbox.stop_drains"
)
