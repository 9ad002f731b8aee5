"""Holding leases while receivers run, letting them go, and retrying the short
statements that do both.

One daemon thread per process (`LeaseKeeper`) renews every lease a third of its length
after the last renewal, so a slow receiver delays only its own shard. A receiver that
runs past OUTBOX_RECEIVER_DEADLINE_SECONDS is taken as hung: its lease is no longer
renewed and expires, and another worker retries the shard.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connections

from outbox.backends.base import Lease, OutboxBackend
from outbox.conf import outbox_settings
from outbox.models import OutboxBase
from outbox.shards import ShardKey

logger = logging.getLogger("outbox.engine")

_T = TypeVar("_T")


@dataclass(eq=False)
class Holding:
    """A lease as the keeper sees it; `lost` is filled in when renewal fails."""

    backend: OutboxBackend
    model: type[OutboxBase]
    lease: Lease
    renewed_at: float = field(default_factory=time.monotonic)
    receiver_started: float | None = None
    lost: set[ShardKey] = field(default_factory=set)
    # A straggler's task (`outbox.engine.delivery`), whose calls the deadline watches
    # instead of `receiver_started`.
    call: Any = None
    group: Any = None  # the group of the call running now, for `slots.running_calls`

    def begin_call(self, group: object) -> float:
        """A receiver call starts (the drain's own thread): the keeper watches it."""
        self.group = group
        started = self.receiver_started = time.monotonic()
        return started

    def end_call(self) -> None:
        self.receiver_started = None

    def needs_renewal(self, now: float) -> bool:
        return now - self.renewed_at >= self.lease.seconds / 3

    def renewal_overdue(self, now: float) -> bool:
        """The keeper should have renewed by now (it stops for a hung receiver, and may
        fall behind): the lease may be close to expiring, or gone."""
        return now - self.renewed_at >= self.lease.seconds / 2

    def hung(self, now: float) -> bool:
        started = self.receiver_started if self.call is None else self.call.receiver_started
        deadline = outbox_settings.RECEIVER_DEADLINE_SECONDS
        return started is not None and now - started > deadline


class LeaseKeeper:
    _instance: LeaseKeeper | None = None
    _instance_pid = 0
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> LeaseKeeper:
        """The keeper of this process (a forked child starts its own)."""
        with cls._instance_lock:
            if cls._instance is None or cls._instance_pid != os.getpid():
                cls._instance = cls()
                cls._instance_pid = os.getpid()
            return cls._instance

    def __init__(self) -> None:
        self._holdings: set[Holding] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, holding: Holding) -> None:
        with self._lock:
            self._holdings.add(holding)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="outbox-lease-keeper", daemon=True
                )
                self._thread.start()

    def drop(self, holding: Holding) -> None:
        with self._lock:
            self._holdings.discard(holding)

    def holdings(self) -> list[Holding]:
        """The leases held now (read-only: the calls running, for the drain's beacon)."""
        with self._lock:
            return list(self._holdings)

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                holdings = list(self._holdings)
            if holdings:
                self.renew_due(holdings)

    def renew_due(self, holdings: list[Holding]) -> None:
        now = time.monotonic()
        try:
            for holding in holdings:
                if holding.needs_renewal(now) and not holding.hung(now):
                    self._renew(holding)
        finally:
            # This thread is idle most of the time: hold no connection between rounds.
            connections.close_all()

    def _renew(self, holding: Holding) -> None:
        try:
            held = holding.backend.renew(holding.model, holding.lease)
        except Exception:
            logger.warning("outbox lease renewal failed; will retry", exc_info=True)
            return
        holding.renewed_at = time.monotonic()
        holding.lost.update(key for key in holding.lease.shards if key not in held)


def retrying(backend: OutboxBackend, operation: Callable[[], _T]) -> _T:
    """Run a short engine statement, retrying the errors the backend calls transient
    (deadlocks and lock timeouts)."""
    for attempt in range(5):
        try:
            return operation()
        except Exception as exc:
            if attempt == 4 or not backend.is_transient(exc):
                raise
            time.sleep(0.01 * 2**attempt)
    raise AssertionError("unreachable")


def release_quietly(backend: OutboxBackend, model: type[OutboxBase], lease: Lease) -> bool:
    """Release the lease's shards, retrying lock errors; False, with a warning logged,
    if that failed: the leases expire by themselves, and the error that brought the
    caller here matters more."""
    try:
        retrying(backend, lambda: backend.release(model, lease, lease.shards))
    except Exception:
        logger.warning("outbox could not release leases %s", lease.token, exc_info=True)
        return False
    return True
