"""The gauges read on a timer, in a worker process that runs drains as tasks.

A Celery or Django Tasks worker runs short drain tasks and no heartbeat of its own, so
the first drain task a process runs starts one daemon thread there (`start_refresh`)
that reads the backlog and health gauges (`record_backlog`) every
OUTBOX_METRICS_REFRESH_SECONDS, busy or idle, for as long as the process lives.

The thread keeps its database connection between readings and closes it when a reading
fails, so the next reading opens a new one: a server restart or a killed connection
costs one reading (logged once), never the rest.

In Prometheus' multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) every pool process
has such a thread, and the gauges show the most recent reading of any of them: one
reading per interval is enough. A lock file in that directory lets one process read per
interval; the others find the reading fresh and skip theirs.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from django.db import DatabaseError, connections

from outbox.conf import outbox_settings
from outbox.metrics.backlog import record_backlog
from outbox.metrics.feed import installed
from outbox.periodic import OnePerProcess, Periodic

try:
    import fcntl
except ImportError:  # Windows: every process reads
    fcntl = None  # type: ignore[assignment]

__all__ = ["RefreshTimer", "running_timer", "start_refresh", "stop_refresh"]

logger = logging.getLogger("outbox.metrics")

# In PROMETHEUS_MULTIPROC_DIR: locked while a process reads; its mtime says when.
LOCK_NAME = "outbox_gauges.lock"


class RefreshTimer(Periodic):
    """Reads the gauges every `interval` seconds in a daemon thread, until `stop()`."""

    def __init__(self, interval: float, using: str | None = None) -> None:
        super().__init__(interval, "outbox-metrics-refresh")
        self.using = using
        self._failing = False

    def tick(self) -> None:
        self.refresh()

    def closing(self) -> None:
        connections.close_all()  # this thread's own connections

    def refresh(self) -> bool:
        """Read the gauges now unless another process of the same multiprocess directory
        just did; True when this timer read them."""
        with _Turn(self.interval) as turn:
            if not turn.mine:
                return False
            try:
                record_backlog(self.using)
            except DatabaseError:
                self._lost_connection()
                turn.give_back()
                return False
            except Exception:
                logger.exception(
                    "Reading the outbox gauges failed", extra={"event": "outbox.metrics"}
                )
                turn.give_back()
                return False
            self._failing = False
            return True

    def _lost_connection(self) -> None:
        """Close this thread's connections: a broken one would fail every later reading."""
        if not self._failing:
            logger.warning(
                "outbox could not read the gauges; reconnecting at the next reading",
                exc_info=True,
                extra={"event": "outbox.metrics_refresh_failed"},
            )
        self._failing = True
        connections.close_all()


class _Turn:
    """Whether this process reads now: always, unless Prometheus' multiprocess directory
    is set; then only when no other process holds its lock or read within the interval
    (nearly: a tenth of it spare, so timers of equal intervals do not skip each other)."""

    def __init__(self, interval: float) -> None:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.path = Path(directory, LOCK_NAME) if directory and fcntl is not None else None
        self.interval = interval
        self.file: int | None = None
        self.mine = self.path is None

    def __enter__(self) -> _Turn:
        if self.path is None:
            return self
        try:
            self.file = _open(self.path)
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process reads now, or the directory is not writable
            return self
        self.mine = time.time() - os.fstat(self.file).st_mtime >= self.interval * 0.9
        if self.mine:
            os.utime(self.file)
        return self

    def give_back(self) -> None:
        """The reading failed: let the next process that looks read at once."""
        if self.file is not None:
            os.utime(self.file, (0, 0))

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            os.close(self.file)  # releases the lock


def _open(path: Path) -> int:
    """The lock file, created as read long ago: the first process to look reads."""
    try:
        created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return os.open(path, os.O_RDWR)
    os.utime(created, (0, 0))
    return created


_timer: OnePerProcess[RefreshTimer] = OnePerProcess()


def start_refresh(using: str | None = None) -> RefreshTimer | None:
    """Start this process's timer unless it runs already; None when metrics are not
    installed or OUTBOX_METRICS_REFRESH_SECONDS is 0. Called by the drain tasks."""
    interval = outbox_settings.METRICS_REFRESH_SECONDS
    if installed() is None or not interval:
        return None
    return _timer.start(lambda: RefreshTimer(interval, using))


def running_timer() -> RefreshTimer | None:
    """This process's timer, if one runs."""
    return _timer.running()


def stop_refresh(timeout: float | None = 5.0) -> None:
    """Stop this process's timer (tests; a process that stops draining)."""
    _timer.stop(timeout)
