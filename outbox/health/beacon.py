"""The drain processes: each long-running drain's beacon, and the live drains as
`manage.py outbox_status` and the admin dashboard list them.

The beacon (`DrainBeacon`) is a daemon thread of a long-running drain process:
`drain_outboxes --loop`, and a Celery or Django Tasks worker process from its first
outbox task (a Celery pool process from its start). Every `OUTBOX_DRAIN_BEACON_SECONDS`
it records the process in `OutboxDrainProcess` (`outbox.models.drains`), in each
database the process drains, on a connection of its own: host, pid, kind, rows retired
in the last minute (`DrainWorker.rows_retired`), the receiver calls running now and the
longest of them (`outbox.engine.slots.running_calls`, which reads what the engine keeps
anyway). Each beat also adds to the minute's activity there (`OutboxDrainMinute`, the
dashboard's chart): the rows retired since the last beat, and the lag it samples, the
age of the oldest due message of the database's outbox tables (one query per table,
reading the first due row by id). A record is alive for `BEATS_TO_EXPIRY` beats after
its last one, on the database clock; every beat deletes the records past that, and a
beacon that stops (the drain ends, SIGTERM) deletes its own at once. A database that
cannot be reached costs that beat there (logged once), never the drain.

In Prometheus' multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) the beacon also
keeps a beat file in that directory, whose modification time is its record's expiry:
the process serving ``/metrics`` withdraws the gauges of a process whose beat file has
expired (`outbox.metrics.prometheus.sweep_dead_processes`), as it does for a process
that no longer runs. So a drain that hangs as a whole (stopped, frozen) loses its gauges
when it stops being listed alive.

Nothing runs while `OUTBOX_DRAIN_BEACON_SECONDS` is 0.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import logging
import os
import re
import socket
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections, router
from django.db.models import Count
from django.db.models.functions import Now
from django.utils import timezone

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.engine import DrainWorker
from outbox.engine.slots import RunningCall, running_calls
from outbox.models import OutboxBase, OutboxDrainProcess, ShardLease, outbox_models
from outbox.models.drains import BEATS_TO_EXPIRY, forget, record_beat, record_minute
from outbox.periodic import OnePerProcess, Periodic

__all__ = [
    "DrainBeacon",
    "attach_drains",
    "describe_drain",
    "drained_databases",
    "expired_beats",
    "live_drains",
    "remove_beat",
    "running_beacon",
    "start_drain_beacon",
    "stop_drain_beacon",
]

logger = logging.getLogger("outbox.engine")

# A live drain's entry (`live_drains`): these columns, and its ages.
DRAIN_FIELDS = (
    "name",
    "host",
    "pid",
    "kind",
    "started_at",
    "beat_at",
    "rows_last_minute",
    "calls_running",
    "stuck_calls",
    "longest_call_seconds",
    "longest_call",
)

# The window of `rows_last_minute`.
MINUTE = 60.0

# A beacon's beat file in PROMETHEUS_MULTIPROC_DIR; not `*.db`, which prometheus_client reads.
BEAT_FILE = "outbox_drain_{pid}.beat"
_BEAT_FILE = re.compile(r"outbox_drain_(\d+)\.beat")


def process_name(pid: int | None = None) -> str:
    """`host:pid`, the name of this process's record (and the start of its leases'
    holder)."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"[:128]


def drained_databases(
    models: Sequence[type[OutboxBase]] | None = None, using: str | None = None
) -> list[str]:
    """The databases a drain of `models` (default: every outbox table) on `using`
    (default: each table's own) works on."""
    return sorted({using or router.db_for_write(model) for model in models or outbox_models()})


def describe_call(call: RunningCall) -> str:
    """`shard eu/ORGANIZATION/3, category ORGANIZATION_UPDATE` (given up: said so)."""
    shown = f"shard {registry.shard_name(call.shard)}"
    if call.category is not None:
        shown += f", category {registry.category_name(call.category)}"
    if call.given_up:
        shown += ", given up at the timeout"
    return shown[:255]


class DrainBeacon(Periodic):
    """Records this process as a `kind` drain of `databases` every `every` seconds,
    from a daemon thread, until `stop()`, which deletes the record."""

    def __init__(self, kind: str, databases: Sequence[str], every: float) -> None:
        super().__init__(every, "outbox-drain-beacon")
        self.kind = kind
        self.databases = list(databases)
        self.every = every
        self.name = process_name()
        self.pid = os.getpid()
        self._samples: deque[tuple[float, int]] = deque()
        # Rows retired by this process as of the last beat (`beat` adds the rest).
        self._rows_recorded = DrainWorker.rows_retired()
        self._failing: set[str] = set()

    def tick(self) -> None:
        try:
            self.beat()
        except Exception:  # a beacon that stops would list a live drain as dead
            logger.exception("outbox drain beacon failed", extra={"event": "outbox.drain_beacon"})

    def closing(self) -> None:
        """Stopping: the record is deleted (on the beacon's own connections, which then
        close)."""
        try:
            self._forget()
        finally:
            connections.close_all()  # this thread's own connections

    def state(self) -> dict[str, Any]:
        """What the record says the process is doing now."""
        calls = running_calls()
        longest = calls[0] if calls else None
        return {
            "rows_last_minute": self._rows_last_minute(),
            "calls_running": len(calls),
            "stuck_calls": sum(call.given_up for call in calls),
            "longest_call_seconds": round(longest.seconds, 3) if longest else None,
            "longest_call": describe_call(longest) if longest else "",
        }

    def beat(self) -> None:
        """Record this process in each database now; a failure is logged once per
        database until it succeeds again."""
        fields = {"host": socket.gethostname()[:100], "pid": self.pid, "kind": self.kind}
        fields.update(self.state())
        expires_in = self.every * BEATS_TO_EXPIRY
        rows = DrainWorker.rows_retired()
        new_rows, self._rows_recorded = max(rows - self._rows_recorded, 0), rows
        minute = timezone.now().replace(second=0, microsecond=0)
        for alias in self.databases:
            try:
                record_beat(alias, self.name, expires_in=expires_in, **fields)
                record_minute(alias, minute, new_rows, oldest_due_age(alias))
            except DatabaseError:
                self._lost(alias)
            else:
                self._failing.discard(alias)
        self._touch_beat_file(expires_in)

    def _rows_last_minute(self) -> int:
        """Rows retired since the newest sample a minute old or more (since the start,
        in the first minute)."""
        now, rows = time.monotonic(), DrainWorker.rows_retired()
        samples = self._samples
        samples.append((now, rows))
        while len(samples) > 1 and samples[1][0] <= now - MINUTE:
            samples.popleft()
        return max(rows - samples[0][1], 0)

    def _lost(self, alias: str) -> None:
        if alias not in self._failing:
            logger.warning(
                "outbox drain beacon could not record this process on %r; retrying",
                alias,
                exc_info=True,
                extra={"event": "outbox.drain_beacon_failed", "using": alias},
            )
        self._failing.add(alias)
        connections[alias].close()  # a broken connection would fail every later beat

    def _forget(self) -> None:
        for alias in self.databases:
            try:
                forget(alias, self.name)
            except DatabaseError:  # it expires by itself
                logger.warning("outbox drain beacon could not delete its record on %r", alias)
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory:
            remove_beat(directory, self.pid)

    def _touch_beat_file(self, expires_in: float) -> None:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return
        path = os.path.join(directory, BEAT_FILE.format(pid=self.pid))
        expires = time.time() + expires_in
        try:
            with open(path, "a"):
                pass
            os.utime(path, (expires, expires))
        except OSError:  # a directory not writable: the gauges go when the process does
            pass


def oldest_due_age(using: str) -> float:
    """Seconds since the oldest due message of the outbox tables on `using` was written
    (those routed there; every table for a database none is routed to), by the first
    due row of each by id: 0.0 when none is due."""
    models = [model for model in outbox_models() if router.db_for_write(model) == using]
    oldest = None
    for model in models or outbox_models():
        due = model._default_manager.using(using).pending().filter(scheduled_for__lte=Now())
        first = due.order_by("id").values_list("date_added", flat=True).first()
        if first is not None and (oldest is None or first < oldest):
            oldest = first
    return max((timezone.now() - oldest).total_seconds(), 0.0) if oldest else 0.0


def expired_beats(directory: str) -> list[int]:
    """The processes whose beat file in `directory` has expired: they stopped beating."""
    now = time.time()
    expired = []
    for path in glob.glob(os.path.join(glob.escape(directory), "outbox_drain_*.beat")):
        match = _BEAT_FILE.fullmatch(os.path.basename(path))
        with contextlib.suppress(OSError):  # removed meanwhile
            if match and os.stat(path).st_mtime < now:
                expired.append(int(match.group(1)))
    return sorted(expired)


def remove_beat(directory: str, pid: int) -> None:
    with contextlib.suppress(OSError):
        os.remove(os.path.join(directory, BEAT_FILE.format(pid=pid)))


# --- This process's beacon ---------------------------------------------------------

_beacon: OnePerProcess[DrainBeacon] = OnePerProcess()
_exit_hooked = False


def start_drain_beacon(kind: str, databases: Sequence[str] | None = None) -> DrainBeacon | None:
    """Start this process's beacon as a `kind` drain of `databases` (default: every
    outbox table's) unless one runs already; None while OUTBOX_DRAIN_BEACON_SECONDS is
    0. It stops, deleting its record, at `stop_drain_beacon()` or interpreter exit."""
    global _exit_hooked
    every = outbox_settings.DRAIN_BEACON_SECONDS
    if not every:
        return None
    beacon = _beacon.start(
        lambda: DrainBeacon(
            kind, list(databases) if databases is not None else drained_databases(), every
        )
    )
    if not _exit_hooked:
        atexit.register(stop_drain_beacon)
        _exit_hooked = True
    return beacon


def running_beacon() -> DrainBeacon | None:
    """This process's beacon, if one runs."""
    return _beacon.running()


def stop_drain_beacon(timeout: float | None = 5.0) -> None:
    """Stop this process's beacon, which deletes its record (a drain that ends). A
    process forked from one with a beacon has none running: nothing is deleted."""
    _beacon.stop(timeout)


# --- The live drains, as status and the dashboard show them -------------------------


def live_drains(using: str) -> list[dict[str, Any]]:
    """The drains alive on database `using`, oldest first, as JSON-friendly values;
    their ages on the database clock, and the shards each holds a lease on there now
    (a lease's holder starts with its drain's `host:pid`). Two queries."""
    drains = OutboxDrainProcess.objects.using(using).alive().annotate(now=Now())
    listed = list(drains.order_by("started_at", "name").values(*DRAIN_FIELDS, "now"))
    if not listed:
        return []
    held = _shards_held(using)
    for drain in listed:
        now, started, beat = drain.pop("now"), drain["started_at"], drain["beat_at"]
        drain.update(
            started_at=started.isoformat(),
            up_seconds=round(max((now - started).total_seconds(), 0.0), 3),
            beat_at=beat.isoformat(),
            beat_seconds_ago=round(max((now - beat).total_seconds(), 0.0), 3),
            shards_held=held[drain["name"]],
        )
    return listed


def _shards_held(using: str) -> Counter[str]:
    """Shards held now on `using`, by the `host:pid` of their holder."""
    held: Counter[str] = Counter()
    leases = ShardLease.objects.using(using).held().values("holder").annotate(n=Count("id"))
    for lease in leases.order_by():
        held[lease["holder"].rsplit(":", 1)[0]] += lease["n"]
    return held


def attach_drains(tables: list[dict[str, Any]]) -> None:
    """Add to each table of `statuses()` its database's live drains ("drains"), read
    once per database."""
    read: dict[str, list[dict[str, Any]]] = {}
    for table in tables:
        database = table["database"]
        if database not in read:
            read[database] = live_drains(database)
        table["drains"] = read[database]


def describe_drain(drain: dict[str, Any]) -> str:
    """One line: `host:pid (loop) up 5m3s, last beat 2.0s ago, 120 rows in the last
    minute, 4 shard(s) held, 2 call(s) running, the longest 12s (shard ..., category
    ...)`."""
    shown = (
        f"{drain['name']} ({drain['kind']}) up {_seconds(drain['up_seconds'])}, "
        f"last beat {_seconds(drain['beat_seconds_ago'])} ago, "
        f"{drain['rows_last_minute']} rows in the last minute, "
        f"{drain['shards_held']} shard(s) held, {drain['calls_running']} call(s) running"
    )
    if drain["longest_call_seconds"] is not None:
        shown += (
            f", the longest {_seconds(drain['longest_call_seconds'])} ({drain['longest_call']})"
        )
    if drain["stuck_calls"]:
        shown += f", {drain['stuck_calls']} given up at the timeout and still running"
    return shown


def _seconds(seconds: float) -> str:
    """42s, 3m5s, 2h10m."""
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60}s"
    return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
