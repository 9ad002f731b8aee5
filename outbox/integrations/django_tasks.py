"""Draining with Django's Tasks framework (Django 6): no Celery needed.

The same drain as the Celery integration, as Django Tasks:

- `schedule_drains`: reserve due shards and enqueue `drain_shards` tasks for them;
  enqueue it periodically with whatever scheduler the project has.
- `drain_shards`: drain the given shards of one table.
- `drain_all`: drain every due shard of every table, within OUTBOX_TASK_SECONDS.
- `prompt_drain`: the OUTBOX_PROMPT_DRAIN hook enqueuing `drain_shards` after a commit.

Enqueue them with `enqueue(task, *args)`: it picks OUTBOX_TASKS_BACKEND and
OUTBOX_TASKS_QUEUE_NAME as they are set then. The declarations below read the two
settings at import as well: Django validates a task against its backend and queue when
it is declared, and the outbox's own are the ones the system checks vouch for (Django's
default queue may not exist on the project's default backend).

Each task runs a `DrainWorker` with its signal handling on: a worker that runs tasks in
its main thread and gets SIGTERM or SIGINT during one finishes the receiver in flight,
releases its leases, then lets the worker's own handler run. With OUTBOX_METRICS set,
the first outbox task a worker process runs starts its gauge timer
(`outbox.metrics.refresh`), which reads the backlog and health gauges every
OUTBOX_METRICS_REFRESH_SECONDS from then on, and its liveness file
(OUTBOX_TASK_LIVENESS_FILE, `outbox.integrations.task_liveness`) and its drain
beacon (OUTBOX_DRAIN_BEACON_SECONDS, `outbox.health.beacon`: listed as a live drain
until the process exits or stops beating). Importing this module
needs Django 6 (`django.tasks`); nothing else in the app imports it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from django.tasks import Task, TaskResult, task

from outbox.conf import outbox_settings
from outbox.engine import DrainWorker
from outbox.health.beacon import start_drain_beacon
from outbox.integrations.dispatch import (
    DrainOrder,
    all_tables_worker,
    order_worker,
    plan_drains,
    prompt_orders,
    task_result,
)
from outbox.integrations.task_liveness import start_task_liveness
from outbox.metrics.refresh import start_refresh
from outbox.models import OutboxBase
from outbox.models.drains import DJANGO_TASKS
from outbox.shards import ShardKey


def enqueue(task: Task[Any, Any], *args: Any) -> TaskResult[Any, Any]:
    """Enqueue an outbox task on OUTBOX_TASKS_BACKEND and OUTBOX_TASKS_QUEUE_NAME."""
    configured = task.using(
        backend=outbox_settings.TASKS_BACKEND,
        queue_name=outbox_settings.TASKS_QUEUE_NAME,
    )
    return configured.enqueue(*args)


_BACKEND = outbox_settings.TASKS_BACKEND
_QUEUE_NAME = outbox_settings.TASKS_QUEUE_NAME


@task(backend=_BACKEND, queue_name=_QUEUE_NAME)
def schedule_drains() -> int:
    """Reserve due shards of every outbox table and enqueue drain tasks for them."""
    _started()
    orders = plan_drains()
    for order in orders:
        enqueue(drain_shards, *order.as_args())
    return len(orders)


@task(backend=_BACKEND, queue_name=_QUEUE_NAME)
def drain_shards(
    table: str, using: str, shards: Sequence[Sequence[Any]], reservation: str | None = None
) -> dict[str, Any]:
    """Drain the given shards of one table."""
    return _run(order_worker(DrainOrder.from_args(table, using, shards, reservation)))


@task(backend=_BACKEND, queue_name=_QUEUE_NAME)
def drain_all() -> dict[str, Any]:
    """Drain every due shard of every outbox table, within OUTBOX_TASK_SECONDS."""
    return _run(all_tables_worker())


def prompt_drain(using: str, shards: Mapping[type[OutboxBase], Collection[ShardKey]]) -> None:
    """OUTBOX_PROMPT_DRAIN hook: enqueue a drain of the shards a commit just wrote."""
    for order in prompt_orders(using, shards):
        enqueue(drain_shards, *order.as_args())


def _started() -> None:
    """What the first outbox task of a worker process starts: the gauge timer, the
    liveness file and the drain's beacon, where they are configured (each once per
    process)."""
    start_refresh()
    start_task_liveness()
    start_drain_beacon(DJANGO_TASKS)


def _run(worker: DrainWorker) -> dict[str, Any]:
    _started()
    # The task worker's own SIGTERM/SIGINT handler runs once the drain has stopped: it
    # then sees no task running and shuts down as it would have.
    with worker.handling_signals(pass_on=True):
        return task_result(worker.run())
