"""(e) django-domain-events, used as its README documents: `fire()` in the transaction,
`run_relay` (what `manage.py deliver_events` runs) delivering.

Producer: every message is a `fire(BenchMessage(...))` inside `transaction.atomic()`,
one transaction per chunk of messages (setup, not measured). `fire()` writes one event
row and one delivery row per durable receiver; the bench declares one durable receiver,
so one delivery row per message. Its codec takes flat scalar fields only, so the
message's keys and payload are fields of the event: shard scope and identifier, object,
version and name, the same values `Shape.messages()` gives every contender. The package
has no key or ordering concept (deliveries are claimed by `available_at`, then id), so
the shard is carried, not honoured.

Consumer: `run_relay(batch_size=BATCH_SIZE)` in one process, stopped by its own `stop`
hook at the budget or on its first idle pass (its `wait` hook notes that the claim came
back empty). Per message the relay reads the delivery row and its event, decodes the
payload, and runs the receiver in a transaction with a fenced UPDATE to `succeeded`,
one COMMIT per message. Rows are not deleted: a delivered event stays in the log until
`prune_events` (retention 90 days), so retired means "no longer owed".

The idle prune sweep (`RELAY_PRUNE`) is turned off in bench/settings.py: it deletes
nothing here (no event is past its retention) and is housekeeping, not delivery.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from itertools import islice
from typing import Any

from django_domain_events import DURABLE, event, receiver

FIRE_CHUNK = 2000  # messages per producer transaction (setup)
# Rows per claim. Its docs default BATCH_SIZE to 50 and say a batch costs the fewest writes
# while every row of it starts within a tenth of the lease (33 s; 2,000 rows start within
# ~5 s here). Its claim reads the owed rows in (available_at, id) order: on a 100k backlog
# one claim took ~25 ms for 50 rows and ~65 ms for 2,000, and a 60 s drain of 100k
# ordered-stream rows ran ~15% faster at 2,000 (bench/README.md, "The peers").
BATCH_SIZE = 2000

calls = 0


@event(name="bench.message")
@dataclass(frozen=True)
class BenchMessage:
    shard_scope: int
    shard_identifier: int
    object_identifier: int
    version: int
    name: str


@receiver(BenchMessage, mode=DURABLE, key="bench.count_call")
def count_call(message: BenchMessage) -> None:
    """The durable receiver: one counter increment, like bench.receivers.count_call."""
    global calls
    calls += 1


def _tables() -> list[str]:
    from django_domain_events.models.delivery_record import DeliveryRecord
    from django_domain_events.models.event_record import EventRecord
    from django_domain_events.models.lane_pause_record import LanePauseRecord
    from django_domain_events.models.receiver_last_success import ReceiverLastSuccess

    models = (DeliveryRecord, EventRecord, LanePauseRecord, ReceiverLastSuccess)
    return [model._meta.db_table for model in models]


def clear() -> None:
    """Empty the package's tables (before a load, and after a drain is counted)."""
    from django.db import connection

    with connection.cursor() as cursor:
        names = ", ".join(connection.ops.quote_name(table) for table in _tables())
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def load(shape: Any) -> int:
    """Fire one event per message of `shape`, a transaction per chunk; return how many
    delivery rows are owed (setup, in the parent process)."""
    from django.db import connection, transaction
    from django_domain_events import fire

    clear()
    messages = shape.messages()
    while chunk := list(islice(messages, FIRE_CHUNK)):
        with transaction.atomic():
            for message in chunk:
                fire(
                    BenchMessage(
                        shard_scope=message["shard_scope"],
                        shard_identifier=message["shard_identifier"],
                        object_identifier=message["object_identifier"],
                        version=message["payload"]["version"],
                        name=message["payload"]["name"],
                    )
                )
    with connection.cursor() as cursor:
        for table in _tables():
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    return left()


def left() -> int:
    """Deliveries still owed: not succeeded, dead, orphaned or cancelled."""
    from django_domain_events.models.delivery_record import DeliveryRecord
    from django_domain_events.utils import owed

    return int(DeliveryRecord.objects.filter(owed()).count())


def run(budget: float, batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """One relay until nothing is owed or `budget` runs out (in a bench worker)."""
    from django_domain_events import DeliveryStatus, run_relay

    deadline = time.monotonic() + budget
    idle = False

    def wait(timeout: float) -> bool:
        nonlocal idle
        idle = True  # the pass claimed nothing: the backlog is drained
        return False

    def stop() -> bool:
        return idle or time.monotonic() >= deadline

    counts = run_relay(
        worker_id=f"bench:{os.getpid()}", wait=wait, stop=stop, batch_size=batch_size
    )
    succeeded = counts.get(DeliveryStatus.SUCCEEDED, 0)
    return {
        "receiver_calls": calls,
        "rows_retired": succeeded,
        "failures": sum(counts.values()) - succeeded,
        "batch_size": batch_size,
        "complete": idle,
    }
