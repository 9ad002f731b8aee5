"""(f) django-reliable-outbox, used as its docs show: `publish()` in the transaction,
the `outbox_worker` loop delivering to a local `@handler`.

Not installed by the bench extra: the package needs Python >= 3.12 (it is written with
PEP 695 generics), so on an older interpreter it is left out with that reason. Install
it beside the bench on 3.12+ with `pip install django-reliable-outbox` (bench/README.md).

Producer: every message is a `publish("bench.message", message, key=shard)` inside
`transaction.atomic()`, one transaction per chunk of messages (setup, not measured). One
row per message, payload = the message `Shape.messages()` gives every contender. The key
is the message's shard (`"scope:identifier"`): "messages sharing a key are processed one
at a time, in insertion order", the package's per-key FIFO, which is what a shard is.

Consumer: one `reliable_outbox.worker.Worker(batch_size=BATCH_SIZE)` run with
`run(burst=True)`, which is `manage.py outbox_worker --burst --batch-size N`: it returns
once nothing is due. At the budget a timer calls `worker.stop()`, its graceful stop
(finish the message in hand, hand back the rest of the batch). Per batch, one claim
(`UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)` over due key heads); per message,
a transaction with the handler call and a fenced UPDATE to `delivered`, one COMMIT per
message. Delivered rows stay (until `outbox_cleanup`), so retired means "no longer
pending".
"""

from __future__ import annotations

import threading
from itertools import islice
from typing import Any

EVENT = "bench.message"
PUBLISH_CHUNK = 2000  # messages per producer transaction (setup)
# Messages per claim. Its default is 10; its bench README runs 10 and shows
# `--batch-size 50`. Its claim walks pending rows in id order to the first LIMIT key heads:
# on a 100k backlog ~1 ms for 10 rows, ~2 ms for 50, and 2,000 costs ~80 ms in one message
# per shard but ~380 ms in ordered streams, whose 1,000 heads never fill it, so the claim
# reads the whole backlog. 50 is its cheapest per message (bench/README.md, "The peers").
BATCH_SIZE = 50

calls = 0
failures = 0


def count_call(envelope: Any) -> None:
    """The local handler: one counter increment, like bench.receivers.count_call."""
    global calls
    calls += 1


def _count_failure(**kwargs: Any) -> None:
    global failures
    failures += 1


def _tables() -> list[str]:
    from reliable_outbox.models import InboxMessage, OutboxMessage

    return [OutboxMessage._meta.db_table, InboxMessage._meta.db_table]


def clear() -> None:
    """Empty the package's tables (before a load, and after a drain is counted)."""
    from django.db import connection

    with connection.cursor() as cursor:
        names = ", ".join(connection.ops.quote_name(table) for table in _tables())
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def load(shape: Any) -> int:
    """Publish one message per row of `shape`, a transaction per chunk; return how many
    are pending (setup, in the parent process)."""
    from django.db import connection, transaction
    from reliable_outbox import publish

    clear()
    messages = shape.messages()
    while chunk := list(islice(messages, PUBLISH_CHUNK)):
        with transaction.atomic():
            for message in chunk:
                shard = f"{message['shard_scope']}:{message['shard_identifier']}"
                publish(EVENT, message, key=shard)
    with connection.cursor() as cursor:
        for table in _tables():
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    return left()


def left() -> int:
    """Messages still pending (delivered and dead ones are settled)."""
    from reliable_outbox.models import OutboxMessage, Status

    return int(OutboxMessage.objects.filter(status=Status.PENDING).count())


def run(budget: float, batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """One worker until nothing is due or `budget` runs out (in a bench worker)."""
    from reliable_outbox import handler
    from reliable_outbox.signals import message_dead_lettered, message_failed
    from reliable_outbox.worker import Worker

    handler(EVENT)(count_call)
    message_failed.connect(_count_failure, weak=False)
    message_dead_lettered.connect(_count_failure, weak=False)
    worker = Worker(batch_size=batch_size)
    timer = threading.Timer(budget, worker.stop)
    timer.daemon = True
    timer.start()
    try:
        worker.run(burst=True)
    finally:
        timer.cancel()
    return {
        "receiver_calls": calls,
        "rows_retired": calls,
        "failures": failures,
        "batch_size": batch_size,
        "complete": not worker.stop_event.is_set(),
    }
