"""The stress receiver: journals every call and acts out the faults the runner asks for.

Each call is one autocommit INSERT into `Journal` with time.time() start and end, so
calls of different processes can be compared. Fault flags (`Control`) are re-read at
most every 0.3 s per process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.db.backends.signals import connection_created
from django.dispatch import Signal

from outbox.signals import process_region_outbox
from stress.outboxes import StressCategory

PROCESS = os.environ.get("STRESS_PROCESS", "stress")
_REFRESH_S = 0.3


class ReceiverFailure(Exception):
    """Raised by the receiver while a `fail` fault is active on its shard."""


class _Flags:
    def __init__(self) -> None:
        self.read_at = 0.0
        self.fail: dict[int, float] = {}
        self.hang: dict[int, tuple[int, float]] = {}

    def refresh(self) -> None:
        from stress.models import Control

        now = time.time()
        if now - self.read_at < _REFRESH_S:
            return
        self.read_at = now
        rows = list(Control.objects.filter(kind__in=["fail", "hang"], used=False))
        self.fail = {c.shard: c.until for c in rows if c.kind == "fail"}
        self.hang = {c.shard: (c.pk, c.seconds) for c in rows if c.kind == "hang"}


flags = _Flags()


def _take_hang(shard: int) -> float:
    """Claim the one-shot hang fault of this shard; the seconds to sleep, or 0."""
    from stress.models import Control

    if shard not in flags.hang:
        return 0.0
    pk, seconds = flags.hang.pop(shard)
    taken = Control.objects.filter(pk=pk, used=False).update(used=True)
    return seconds if taken else 0.0


def receive(sender: Any, **kwargs: Any) -> None:
    """Journal the call; raise or hang when a fault says so."""
    from stress.models import Journal

    start = time.time()
    payload = kwargs["payload"]
    shard = int(kwargs["shard_identifier"])
    flags.refresh()
    hung = 0.0
    ok = True
    if flags.fail.get(shard, 0.0) > start:
        ok = False
    elif PROCESS.startswith("drainer"):
        hung = _take_hang(shard)
        if hung:
            time.sleep(hung)
    Journal.objects.create(
        shard=shard,
        category=int(sender),
        obj=int(kwargs["object_identifier"]),
        seq=int(payload["seq"]),
        sseq=int(payload["sseq"]),
        process=PROCESS,
        pid=os.getpid(),
        start=start,
        end=time.time(),
        ok=ok,
        hung=bool(hung),
    )
    if not ok:
        raise ReceiverFailure(f"stress fault: shard {shard} fails for now")


def _register_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Record a drainer's server-side connection id so faults can terminate it."""
    if not PROCESS.startswith("drainer"):
        return
    query = (
        "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
    )
    with connection.cursor() as cursor:
        cursor.execute(query)
        server_id = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO stress_conn (process, pid, server_id) VALUES (%s, %s, %s)",
            [PROCESS, os.getpid(), server_id],
        )


def connect() -> None:
    signal: Signal = process_region_outbox
    for category in (StressCategory.COALESCING, StressCategory.DISTINCT):
        signal.connect(receive, sender=category, weak=False, dispatch_uid=f"stress-{category}")
    connection_created.connect(_register_connection, dispatch_uid="stress-conn")
