"""The stress receiver: journals every call and acts out the faults the runner asks for.

Each call reads its shard's lease row when it starts (the batch token and the holder,
so the checker knows which batch a call belonged to and whether its process held the
shard) and ends with one autocommit INSERT into `Journal` with time.time() start and
end, so calls of different processes can be compared (a hung call is inserted when it
starts and updated when it returns), and the message id it was given. Fault flags
(`Control`) are re-read at most every 0.3 s per process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from django.db.backends.signals import connection_created
from django.dispatch import Signal

from outbox.signals import process_region_outbox
from stress import handoff
from stress.outboxes import StressCategory, StressScope

PROCESS = os.environ.get("STRESS_PROCESS", "stress")
RECEIVER_SECONDS = float(os.environ.get("STRESS_RECEIVER_MS", "0")) / 1000
DRAINER = PROCESS.startswith("drainer")
_REFRESH_S = 0.3


class ReceiverFailure(Exception):
    """Raised by the receiver while a `fail` fault is active on its shard."""


class _Flags:
    def __init__(self) -> None:
        self.read_at = 0.0
        self.fail: dict[int, float] = {}
        self.hang: dict[int, tuple[int, float]] = {}
        self.slow: list[tuple[int, float]] = []

    def refresh(self) -> None:
        from stress.models import Control

        now = time.time()
        if now - self.read_at < _REFRESH_S:
            return
        self.read_at = now
        rows = list(Control.objects.filter(kind__in=["fail", "hang", "slow"], used=False))
        self.fail = {c.shard: c.until for c in rows if c.kind == "fail"}
        self.hang = {c.shard: (c.pk, c.seconds) for c in rows if c.kind == "hang"}
        self.slow = [(c.pk, c.seconds) for c in rows if c.kind == "slow"]


flags = _Flags()


def _take(pk: int) -> bool:
    """Claim a one-shot fault (only one process gets it)."""
    from stress.models import Control

    return bool(Control.objects.filter(pk=pk, used=False).update(used=True))


def _take_hang(shard: int) -> float:
    """Claim the one-shot hang fault of this shard; the seconds to sleep, or 0."""
    if shard not in flags.hang:
        return 0.0
    pk, seconds = flags.hang.pop(shard)
    return seconds if _take(pk) else 0.0


def _take_slow(shard: int, obj: int) -> float:
    """Claim the one-shot `slow` fault if this shard likely has work left after this call
    (another object has a row newer than this one's: not delivered yet in this batch, in
    most cases); tell the runner who is in flight."""
    from django.db.models import Max

    from outbox.models import RegionOutbox

    if not flags.slow:
        return 0.0
    rows = RegionOutbox.objects.filter(shard_scope=StressScope.STRESS, shard_identifier=shard)
    mine = rows.filter(object_identifier=obj).aggregate(newest=Max("id"))["newest"] or 0
    if not rows.exclude(object_identifier=obj).filter(id__gt=mine).exists():
        return 0.0
    pk, seconds = flags.slow.pop()
    if not _take(pk):
        return 0.0
    marker = Path(os.environ["STRESS_TMP"]) / f"slow-{pk}.json"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "shard": shard, "at": time.time()}))
    tmp.rename(marker)
    return seconds


def _lease_of(shard: int) -> tuple[str, str]:
    """(token, holder) of the shard's lease row right now; empty if there is none."""
    from outbox.models import RegionOutbox, ShardLease

    row = (
        ShardLease.objects.filter(
            outbox=RegionOutbox._meta.label_lower,
            region_name="",
            shard_scope=StressScope.STRESS,
            shard_identifier=shard,
        )
        .values_list("token", "holder")
        .first()
    )
    return (row[0] or "", row[1] or "") if row else ("", "")


def receive(sender: Any, **kwargs: Any) -> None:
    """Journal the call; raise, hang or dawdle when a fault says so."""
    from stress.models import Journal

    start = time.time()
    payload = kwargs["payload"]
    shard = int(kwargs["shard_identifier"])
    obj = int(kwargs["object_identifier"])
    token, holder = _lease_of(shard)
    flags.refresh()
    published = handoff.published(kwargs["message_id"])  # by the relay, in the relay leg
    call = Journal(
        shard=shard,
        category=int(sender),
        obj=obj,
        seq=int(payload["seq"]),
        sseq=int(payload["sseq"]),
        process=PROCESS,
        pid=os.getpid(),
        start=start,
        end=start,
        ok=flags.fail.get(shard, 0.0) <= start and published,
        token=token,
        holder=holder,
        message_id=kwargs["message_id"],
    )
    if call.ok and DRAINER:
        _act_out(call)
        if RECEIVER_SECONDS:
            time.sleep(RECEIVER_SECONDS)  # a receiver that waits on another service
    call.end = time.time()
    call.save()
    if not published:
        raise ReceiverFailure(f"the relay failed to publish on shard {shard}")
    if not call.ok:
        raise ReceiverFailure(f"stress fault: shard {shard} fails for now")


def _act_out(call: Any) -> None:
    """Hang or dawdle if a fault says so. A hung call is journaled when it starts, as not
    (yet) successful, so a drainer killed during the hang leaves a trace of its batch."""
    seconds = _take_hang(call.shard)
    if seconds:
        call.hung = True
        call.ok = False
        call.save()
        call.ok = True
    elif seconds := _take_slow(call.shard, call.obj):
        call.slow = True
    if seconds:
        time.sleep(seconds)


def _register_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Record a drainer's server-side connection id so faults can terminate it."""
    if not DRAINER:
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
