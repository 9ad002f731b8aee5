"""Draining with Celery: beat fans due shards out to drain tasks across workers.

Wire it into the project's Celery app::

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()
    add_beat_schedule(app)  # registers the tasks, schedules `schedule_drains`

(`register_tasks(app)` registers the tasks without the beat entry.) Task names come
from OUTBOX_CELERY_SCHEDULE_TASK / OUTBOX_CELERY_DRAIN_TASK when the tasks are
registered, the time limit from OUTBOX_CELERY_TIME_LIMIT_SECONDS when a drain is sent:
nothing is read from the settings when this module is imported.

`schedule_drains` (beat, every OUTBOX_CELERY_SCHEDULE_SECONDS) reserves due shards and
sends them out in `drain` tasks of OUTBOX_TASK_SHARDS shards each (see
`outbox.integrations.dispatch`). A `drain` task runs until its shards are done or its
OUTBOX_TASK_SECONDS budget is spent. With OUTBOX_PROMPT_DRAIN set to
``"outbox.integrations.celery.prompt_drain"``, a commit that left rows to the drain
sends a `drain` of its shards right away.

Warm shutdown (SIGTERM to the worker) is translated into `DrainWorker.stop_all()`: in
the worker's main process, and through STOP_SIGNAL in its pool processes. Every drain
then claims nothing new, finishes the receiver in flight, settles and releases its
leases, so other workers continue at once. A receiver still running after
OUTBOX_GRACEFUL_TIMEOUT_SECONDS is left behind; its lease expires.

With OUTBOX_METRICS set, the first outbox task a worker process runs starts its gauge
timer (`outbox.metrics.refresh`): the backlog and health gauges are read every
OUTBOX_METRICS_REFRESH_SECONDS from then on, whether tasks come or not. A pool process
that shuts down withdraws its gauges (`outbox.metrics.feed.process_ended`): it leaves
without the interpreter's exit hooks.

With OUTBOX_DRAIN_BEACON_SECONDS above 0 (the default), the first outbox task a worker
process runs starts its beacon (`outbox.health.beacon`): the process is listed as a live
drain by `outbox_status` and the dashboard until it ends (a pool process deletes its
record as it shuts down) or stops beating.

With OUTBOX_TASK_LIVENESS_FILE set, the worker keeps that file fresh for a liveness probe
from when it is ready (`outbox.integrations.task_liveness`).

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

from celery import Celery, current_app
from celery import signals as celery_signals
from celery.local import Proxy

from outbox.conf import outbox_settings

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

    _started()
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
    from outbox.integrations.dispatch import DrainOrder, order_worker, task_result

    _started()
    order = DrainOrder.from_args(table, using, shards, reservation)
    return task_result(order_worker(order).run())


def _started() -> None:
    """What the first outbox task of a worker process starts, each once per process:
    the gauge timer and the drain's beacon, where they are configured."""
    from outbox.health.beacon import start_drain_beacon
    from outbox.metrics.refresh import start_refresh
    from outbox.models.drains import CELERY

    start_refresh()
    start_drain_beacon(CELERY)


def register_tasks(app: Celery) -> None:
    """Register `schedule_drains` and `drain` on the app under their configured names
    (again: a no-op)."""
    for name, function in (
        (outbox_settings.CELERY_SCHEDULE_TASK, schedule_drains),
        (outbox_settings.CELERY_DRAIN_TASK, drain),
    ):
        # Not `shared`: that would add a finalizer for every app per call, process-wide.
        app.task(name=name, ignore_result=True, shared=False)(function)


def _registered(setting: str) -> Any:
    """The task of the current app registered under the name in `setting`."""
    name = str(getattr(outbox_settings, setting))
    if name not in current_app.tasks:
        register_tasks(current_app)
    return current_app.tasks[name]


# The tasks of the current Celery app, resolved when first used, not at import.
schedule_drains_task: Any = Proxy(lambda: _registered("CELERY_SCHEDULE_TASK"))
drain_task: Any = Proxy(lambda: _registered("CELERY_DRAIN_TASK"))


def send(order: DrainOrder) -> None:
    """Queue one drain task. It expires with its reservation: a task that waited that
    long is dropped, and a later tick hands its shards out again."""
    drain_task.apply_async(
        args=order.as_args(),
        queue=outbox_settings.CELERY_QUEUE,
        expires=outbox_settings.LEASE_SECONDS,
        time_limit=outbox_settings.CELERY_TIME_LIMIT_SECONDS,
    )


def prompt_drain(using: str, shards: Mapping[type[OutboxBase], Collection[ShardKey]]) -> None:
    """OUTBOX_PROMPT_DRAIN hook: send a drain of the shards a commit just wrote."""
    from outbox.integrations.dispatch import prompt_orders

    for order in prompt_orders(using, shards):
        send(order)


def beat_schedule_entry() -> dict[str, Any]:
    """The beat entry of `schedule_drains`; a tick not run within its interval is dropped."""
    interval = outbox_settings.CELERY_SCHEDULE_SECONDS
    options: dict[str, Any] = {"expires": interval}
    if outbox_settings.CELERY_QUEUE:
        options["queue"] = outbox_settings.CELERY_QUEUE
    task = outbox_settings.CELERY_SCHEDULE_TASK
    return {"task": task, "schedule": interval, "options": options}


def add_beat_schedule(app: Celery, name: str = BEAT_ENTRY_NAME) -> None:
    """Register the tasks on the app and add the `schedule_drains` entry to its beat
    schedule (keeping the others)."""
    register_tasks(app)
    app.conf.beat_schedule = {**(app.conf.beat_schedule or {}), name: beat_schedule_entry()}


# Warm shutdown. The worker's main process gets the signal; drains run in its pool
# processes (prefork) or in its own threads (threads, solo pools).


def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    """In the worker's main process: on warm shutdown, stop the drains of this process
    and signal the pool processes to stop theirs. (Django is set up by now.)"""
    from outbox.engine.worker import DrainWorker

    worker = sender

    def stop_drains(**kwargs: Any) -> None:  # runs inside Celery's signal handler
        DrainWorker.stop_all()
        for pid in _pool_processes(worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, STOP_SIGNAL)

    celery_signals.worker_shutting_down.connect(
        stop_drains, weak=False, dispatch_uid="outbox.stop_drains"
    )


def _on_pool_process_init(**kwargs: Any) -> None:
    from outbox.engine.worker import DrainWorker

    DrainWorker.stop_all_on(STOP_SIGNAL)


def _on_pool_process_shutdown(**kwargs: Any) -> None:
    """A pool process ends (recycled, or the worker stops): its Prometheus gauges and its
    drain record with it."""
    from outbox.health.beacon import stop_drain_beacon
    from outbox.metrics.feed import process_ended

    stop_drain_beacon()
    process_ended()


def _on_worker_ready(**kwargs: Any) -> None:
    """In the worker's main process, once it is ready: OUTBOX_TASK_LIVENESS_FILE."""
    from outbox.integrations.task_liveness import start_task_liveness

    start_task_liveness()


def _pool_processes(worker: Any) -> list[int]:
    try:
        processes = worker.pool.info.get("processes", [])
    except Exception:  # no pool yet, or a pool without processes
        return []
    return [pid for pid in processes if isinstance(pid, int) and pid != os.getpid()]


celery_signals.worker_init.connect(_on_worker_init, dispatch_uid="outbox.remember_worker")
celery_signals.worker_ready.connect(_on_worker_ready, dispatch_uid="outbox.task_liveness")
celery_signals.worker_process_init.connect(
    _on_pool_process_init, dispatch_uid="outbox.stop_on_signal"
)
celery_signals.worker_process_shutdown.connect(
    _on_pool_process_shutdown, dispatch_uid="outbox.metrics_process_ended"
)
