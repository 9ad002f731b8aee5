"""What the sustained section watches from the harness while writers and the drain run,
each on a psycopg connection of its own (never the harness's Django connection):

- `Monitor`: the backlog (`count(*)` of the outbox table) every 0.1 s; dead tuples and
  total size of the outbox and lease tables, and the CPU time of the drain process and of
  its database backends (found by application name), every 1 s;
- `Pin`: a `REPEATABLE READ` transaction that runs one SELECT, so its snapshot pins the
  database's xmin horizon, and holds it open for a while.

Every sample carries `time.time()`, the clock the writers and the receiver probe note.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import IsolationLevel

from bench.db import conninfo

# The drain's connections say so in pg_stat_activity (bench.sustained_settings).
DRAIN_APPLICATION = "outbox-bench-sustained-drain"
BACKLOG_EVERY_SECONDS = 0.1
WRITERS_START_TIMEOUT_S = 180.0
STATS_EVERY_SECONDS = 1.0
_TICKS = os.sysconf("SC_CLK_TCK")


def _connect(**kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(**conninfo(), connect_timeout=10, **kwargs)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), None when unavailable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


@dataclass
class Stats:
    at: float
    outbox_dead: int
    outbox_live: int
    outbox_bytes: int
    lease_dead: int
    lease_bytes: int
    drain_cpu_s: float | None
    # CPU time of the drain's database backends, by backend pid.
    drain_db_cpu_s: dict[int, float]


@dataclass
class Monitor:
    outbox_table: str
    lease_table: str
    drain_pid: int
    backlog: list[tuple[float, int]] = field(default_factory=list)
    stats: list[Stats] = field(default_factory=list)
    failure: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Monitor:
        self._conn = _connect(autocommit=True)
        self._thread = threading.Thread(target=self._run, name="sustained-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self._conn.close()

    def _run(self) -> None:
        next_stats = 0.0
        try:
            while not self._stop.is_set():
                now = time.time()
                count = self._conn.execute(f'SELECT count(*) FROM "{self.outbox_table}"')
                self.backlog.append((now, int(count.fetchone()[0])))  # type: ignore[index]
                if now >= next_stats:
                    self.stats.append(self._stats(now))
                    next_stats = now + STATS_EVERY_SECONDS
                self._stop.wait(max(0.0, now + BACKLOG_EVERY_SECONDS - time.time()))
        except Exception as exc:  # reported by the section, which then fails the run
            self.failure = f"monitor: {exc!r}"

    def _stats(self, now: float) -> Stats:
        rows = self._conn.execute(
            "SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [[self.outbox_table, self.lease_table]],
        ).fetchall()
        by_name = {name: (dead, live, size) for name, dead, live, size in rows}
        outbox = by_name.get(self.outbox_table, (0, 0, 0))
        lease = by_name.get(self.lease_table, (0, 0, 0))
        backends = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [DRAIN_APPLICATION]
        ).fetchall()
        backend_cpu = {pid: cpu_seconds(pid) for (pid,) in backends}
        return Stats(
            now,
            outbox[0],
            outbox[1],
            outbox[2],
            lease[0],
            lease[2],
            cpu_seconds(self.drain_pid),
            {pid: cpu for pid, cpu in backend_cpu.items() if cpu is not None},
        )

    def wait_for_empty(self, since: float, timeout: float) -> float | None:
        """Wait until a backlog sample taken after `since` is 0; its time, or None."""
        deadline = time.time() + timeout
        while time.time() < deadline and self.failure is None:
            for at, count in reversed(self.backlog):
                if at < since:
                    break
                if count == 0:
                    return at
            time.sleep(BACKLOG_EVERY_SECONDS / 2)
        return None

    def backlog_between(self, start: float, end: float) -> list[int]:
        return [count for at, count in self.backlog if start <= at <= end]

    def stats_at(self, moment: float) -> Stats | None:
        """The last stats sample taken at or before `moment`."""
        before = [sample for sample in self.stats if sample.at <= moment]
        return before[-1] if before else None


@dataclass
class Pin:
    """Once the outbox's id sequence moves (the writers have started), wait `after_s`,
    then open a REPEATABLE READ transaction, run one SELECT in it and hold it `hold_s`
    seconds."""

    outbox_table: str
    after_s: float
    hold_s: float
    pinned_at: float | None = None
    released_at: float | None = None
    failure: str | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Pin:
        self._thread = threading.Thread(target=self._run, name="sustained-pin", daemon=True)
        self._thread.start()
        return self

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=self.after_s + self.hold_s + 60.0)

    def _run(self) -> None:
        try:
            with _connect(autocommit=True) as watcher:
                sequence = watcher.execute(
                    "SELECT pg_get_serial_sequence(%s, 'id')", [self.outbox_table]
                ).fetchone()[0]  # type: ignore[index]
                query = "SELECT pg_sequence_last_value(%s::regclass)"
                first = watcher.execute(query, [sequence]).fetchone()[0]  # type: ignore[index]
                deadline = time.monotonic() + WRITERS_START_TIMEOUT_S
                while watcher.execute(query, [sequence]).fetchone()[0] == first:  # type: ignore[index]
                    if time.monotonic() > deadline:
                        raise TimeoutError("the writers never started")
                    time.sleep(0.02)
            time.sleep(self.after_s)
            with _connect() as conn:
                conn.isolation_level = IsolationLevel.REPEATABLE_READ
                conn.execute(f'SELECT count(*) FROM "{self.outbox_table}"').fetchone()
                self.pinned_at = time.time()
                time.sleep(self.hold_s)
                conn.rollback()
                self.released_at = time.time()
        except Exception as exc:
            self.failure = f"pin: {exc!r}"


@dataclass
class Vacuumer:
    """A stand-in for autovacuum where the server runs none: a plain VACUUM of the
    tables every `every_s` seconds, as autovacuum would with that naptime and the
    per-table settings of the operating docs (it never skips: the tables churn well past
    their threshold between two rounds)."""

    tables: list[str]
    every_s: float
    runs: list[tuple[float, float]] = field(default_factory=list)  # (start, seconds)
    failure: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Vacuumer:
        self._thread = threading.Thread(target=self._run, name="sustained-vacuum", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60.0)

    def _run(self) -> None:
        names = ", ".join(f'"{table}"' for table in self.tables)
        try:
            with _connect(autocommit=True) as conn:
                while not self._stop.wait(self.every_s):
                    started = time.time()
                    conn.execute(f"VACUUM {names}")
                    self.runs.append((started, time.time() - started))
        except Exception as exc:
            self.failure = f"vacuum stand-in: {exc!r}"
