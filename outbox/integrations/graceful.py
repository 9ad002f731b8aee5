"""Graceful stop of a draining process: claim nothing new, let the receiver in flight
finish within OUTBOX_GRACEFUL_TIMEOUT_SECONDS, release the other leases at once.

A drain runs in a daemon thread with its own stop event, and the calling thread waits
for it. `request_shutdown()` (from a signal handler, or Celery's warm shutdown) sets the
stop event of every drain of the process: the engine then finishes the receiver in
flight, settles and releases every lease it has not processed. If the receiver is still
running when the graceful timeout has passed, the caller stops waiting and the process
exits around the abandoned thread; that shard's lease expires normally.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.db import connections

from outbox.conf import outbox_settings

logger = logging.getLogger("outbox.engine")

_T = TypeVar("_T")

# Process-wide state, touched from signal handlers: no locks (a handler runs in the main
# thread between bytecodes and must never wait for a lock that thread holds).
_running: set[threading.Event] = set()
_shutdown_at: list[float] = []
_forced: list[bool] = []


def request_shutdown(*, force: bool = False) -> None:
    """Stop every drain of this process gracefully (`force`: without waiting for the
    receiver in flight). Safe to call from a signal handler."""
    if not _shutdown_at:
        _shutdown_at.append(time.monotonic())
    if force:
        _forced.append(True)
    for stop in tuple(_running):
        stop.set()


def shutdown_requested() -> bool:
    return bool(_shutdown_at)


def reset() -> None:
    """Forget a past shutdown request (for tests and for long-lived processes)."""
    _shutdown_at.clear()
    _forced.clear()


@dataclass
class Outcome(Generic[_T]):
    """What a supervised drain returned; `finished` is False when it was abandoned."""

    finished: bool
    result: _T | None = None


def run_gracefully(target: Callable[[threading.Event], _T], *, name: str) -> Outcome[_T]:
    """Run `target(stop)` in a thread until it returns, or until a shutdown's grace ends.

    The target must return soon after `stop` is set (the engine does). Exceptions of the
    target are raised here.
    """
    stop = threading.Event()
    box: dict[str, _T] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box["result"] = target(stop)
        except BaseException as exc:  # handed to the waiting thread below
            errors.append(exc)
        finally:
            connections.close_all()

    _running.add(stop)
    if _shutdown_at:
        stop.set()
    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            if thread.is_alive() and _grace_over():
                logger.warning(
                    "outbox drain still in a receiver %ss after shutdown was requested; "
                    "stopping without it, its shard's lease will expire",
                    outbox_settings.GRACEFUL_TIMEOUT_SECONDS,
                    extra={"event": "outbox.graceful_timeout", "drain": name},
                )
                return Outcome(finished=False)
    finally:
        _running.discard(stop)
    if errors:
        raise errors[0]
    return Outcome(finished=True, result=box.get("result"))


def _grace_over() -> bool:
    if not _shutdown_at:
        return False
    if _forced:
        return True
    return time.monotonic() - _shutdown_at[0] > float(outbox_settings.GRACEFUL_TIMEOUT_SECONDS)
