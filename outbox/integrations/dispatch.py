"""What the drain tasks of every task framework share: which shards each task drains.

`plan_drains()` is the scheduler: per outbox table it finds due shards without a live
lease (oldest work first), reserves them with a lease of their own so the next tick
does not hand them out again, and splits them into orders of OUTBOX_TASK_SHARDS shards.
Tables are interleaved, so a backlog in one never queues ahead of all the others, and
each table keeps at most OUTBOX_CELERY_MAX_TASKS orders' worth of shards in flight.

`order_worker()` is the drain task's worker: it gives the reservation back and drains
the shards itself, the engine claiming each one exclusively, so a shard whose lease is
live is never worked on by a second worker. A reservation that no task picks up (a lost
message, a task that expired in the queue) simply expires, and a later tick hands the
shard out again. How a task runs, stops and shuts down is `DrainWorker`'s business.

Orders travel through the broker as plain JSON (`DrainOrder.as_args`).
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps

from outbox.conf import outbox_settings
from outbox.engine import Drainer, DrainOutcome, DrainStats, DrainWorker
from outbox.models import OutboxBase, ShardLease, outbox_models
from outbox.shards import ShardKey


@dataclass
class DrainOrder:
    """Shards of one table for one drain task; `reservation` is the scheduler's token."""

    table: str
    using: str
    shards: list[ShardKey]
    reservation: str | None = None

    def as_args(self) -> list[Any]:
        return [self.table, self.using, [list(key) for key in self.shards], self.reservation]

    @classmethod
    def from_args(
        cls, table: str, using: str, shards: Sequence[Sequence[Any]], reservation: str | None
    ) -> DrainOrder:
        keys = [ShardKey(str(region), int(scope), int(ident)) for region, scope, ident in shards]
        return cls(table, using, keys, reservation)

    def model(self) -> type[OutboxBase]:
        model = apps.get_model(self.table)
        if not issubclass(model, OutboxBase):
            raise TypeError(f"{self.table} is not an outbox table")
        return model


def plan_drains(models: Sequence[type[OutboxBase]] | None = None) -> list[DrainOrder]:
    """Reserve due shards of every table and split them into drain orders."""
    per_table = [_plan_table(model) for model in models or outbox_models()]
    # Round-robin over the tables: the queue alternates between them.
    interleaved = itertools.chain.from_iterable(itertools.zip_longest(*per_table))
    return [order for order in interleaved if order is not None]


def _plan_table(model: type[OutboxBase]) -> list[DrainOrder]:
    drainer = Drainer(model)
    per_task = max(outbox_settings.TASK_SHARDS, 1)
    room = outbox_settings.CELERY_MAX_TASKS * per_task - shards_in_flight(model, drainer.using)
    if room <= 0:
        return []
    reservation = drainer.reserve(room, _reserver())
    reserved = reservation.shards
    return [
        DrainOrder(model._meta.label, drainer.using, reserved[i : i + per_task], reservation.token)
        for i in range(0, len(reserved), per_task)
    ]


def shards_in_flight(model: type[OutboxBase], using: str) -> int:
    """Shards of the table with a live lease: queued for a task, or being drained."""
    return int(ShardLease.objects.using(using).of(model).held().count())


def prompt_orders(
    using: str, shards: Mapping[type[OutboxBase], Collection[ShardKey]]
) -> list[DrainOrder]:
    """Orders for shards just written (no reservation: a busy shard is simply skipped)."""
    per_task = max(outbox_settings.TASK_SHARDS, 1)
    orders = []
    for model, keys in shards.items():
        ordered = sorted(keys)
        for i in range(0, len(ordered), per_task):
            orders.append(DrainOrder(model._meta.label, using, ordered[i : i + per_task]))
    return orders


def order_worker(order: DrainOrder) -> DrainWorker:
    """The worker of a drain task: the order's shards, within OUTBOX_TASK_SECONDS."""
    return DrainWorker(
        [order.model()],
        using=order.using,
        shards=order.shards,
        reservation=order.reservation,
        max_seconds=outbox_settings.TASK_SECONDS,
    )


def all_tables_worker() -> DrainWorker:
    """The worker of a drain-everything task: every table, within OUTBOX_TASK_SECONDS."""
    return DrainWorker(max_seconds=outbox_settings.TASK_SECONDS)


def run_order(order: DrainOrder) -> DrainStats:
    """Drain an order here and now (no signal handling): for tests and scripts."""
    return order_worker(order).run().stats


def task_result(outcome: DrainOutcome) -> dict[str, Any]:
    """A drain task's JSON-friendly result."""
    if outcome.abandoned:
        return {"abandoned": True}
    return stats_summary(outcome.stats)


def stats_summary(stats: DrainStats) -> dict[str, Any]:
    """A task's JSON-friendly result."""
    return {
        "shards": stats.shards,
        "receiver_calls": stats.receiver_calls,
        "rows_retired": stats.rows_retired,
        "failures": stats.failures,
        "retried_later": stats.retried_later,
        "dead_lettered": stats.dead_lettered,
        "leases_lost": stats.leases_lost,
        "seconds": round(stats.seconds, 3),
    }


def _reserver() -> str:
    return f"queued:{socket.gethostname()}:{os.getpid()}"[:128]
