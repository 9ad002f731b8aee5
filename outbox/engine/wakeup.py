"""How an idle drain loop waits: until a table it drains is written to, the poll interval
passes or it is asked to stop, whichever comes first.

Each database the loop drains whose backend offers a wake-up listener
(`OutboxBackend.listener`: PostgreSQL's LISTEN/NOTIFY, with `OUTBOX_NOTIFY` on, the
default) gets one, on a connection of its own, told as a transaction writing to its
tables commits; the wait ends as soon as one arrives. A wake-up is only a hint: the
loop still polls at `OUTBOX_LOOP_INTERVAL_SECONDS`, so a lost one only delays a message
to the next poll. A dropped connection is replaced at the next wait (at most once per
`_RECONNECT_SECONDS` while the database is away), and the wait ends right after a
reconnect, since notifications sent meanwhile are gone. Other databases only poll.

The wait sleeps in `select()` on the listeners' sockets and on a socket that `StopEvent`
writes to when it is set, so a stop request ends it at once.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from django.db import router

from outbox.backends.listener import ListenerLost, WakeListener
from outbox.backends.select import listeners
from outbox.models import OutboxBase, outbox_models

logger = logging.getLogger("outbox.engine")

_RECONNECT_SECONDS = 1.0
_PLAIN_EVENT_SLICE = 0.05  # how often a wait looks at a stop event that is no StopEvent


class StopEvent(threading.Event):
    """A drain's stop event that also tells whoever waits on it with `select()`."""

    def __init__(self) -> None:
        super().__init__()
        self.on_set: list[Callable[[], None]] = []
        # Set by a signal handler, which must take no lock: `is_set()` is true at once,
        # so no slot starts another receiver call before the waiting thread `set()`s.
        self.requested = False

    def is_set(self) -> bool:
        return self.requested or super().is_set()

    def set(self) -> None:
        super().set()
        for callback in tuple(self.on_set):
            callback()


class Waiter:
    """Waits for a notification on the tables of a drain loop, or the poll interval.
    Use it as a context manager: it listens from entry (so nothing committed during the
    first round is missed) to exit."""

    def __init__(
        self,
        models: Sequence[type[OutboxBase]] | None,
        using: str | None,
        stop: threading.Event,
        *,
        listen: bool = True,
    ) -> None:
        self.stop = stop
        self.listeners: dict[str, WakeListener] = listeners(models, using) if listen else {}
        self.databases = {
            using or router.db_for_write(model) for model in models or outbox_models()
        }
        self.connected: set[str] = set()
        self._retry_at = 0.0
        self._wake: tuple[socket.socket, socket.socket] | None = None
        # `wake()` was called: the wait under way, or the next one, ends (drain now).
        self._woken = threading.Event()

    def __enter__(self) -> Waiter:
        if isinstance(self.stop, StopEvent):
            self.stop.on_set.append(self._woken.set)  # a stop ends a plain wait too
        if self.listeners:
            self._wake = socket.socketpair()
            for end in self._wake:
                end.setblocking(False)
            if isinstance(self.stop, StopEvent):
                self.stop.on_set.append(self._interrupt)
            self._connect()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(self.stop, StopEvent):
            for callback in (self._interrupt, self._woken.set):
                if callback in self.stop.on_set:
                    self.stop.on_set.remove(callback)
        self._drop(*self.connected)
        if self._wake is not None:
            for end in self._wake:
                end.close()
            self._wake = None

    @property
    def hears_every_write(self) -> bool:
        """Whether a commit to any table of the loop ends the next wait: each of their
        databases has a listener, connected. Then a round that delivered need not be
        followed by another look before waiting: what was written after its last claim
        is told."""
        return self.databases == self.connected

    def wake(self) -> None:
        """From any thread: end the wait under way, or the next one, as a notification
        would (the drain's straggling call landed: settle it now)."""
        self._woken.set()
        self._interrupt()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True when woken by a notification, a reconnect
        or `wake()` (drain now), False at the timeout or a stop request."""
        deadline = time.monotonic() + timeout
        if self._wake is None:
            return self._plain_wait(deadline)
        try:
            return self._connect() or self._listen(deadline)  # reconnected: drain now
        except Exception:  # the wake-up only hastens the drain: never let it end it
            logger.exception(
                "outbox listener failed; polling until it reconnects",
                extra={"event": "outbox.listener_failed"},
            )
            self._drop(*self.connected)
            self._retry_at = time.monotonic() + _RECONNECT_SECONDS
            self.stop.wait(max(deadline - time.monotonic(), 0.0))
            return False

    def _plain_wait(self, deadline: float) -> bool:
        """No listener: sleep until the deadline, a stop request or `wake()`."""
        slice_ = None if isinstance(self.stop, StopEvent) else _PLAIN_EVENT_SLICE
        while not self.stop.is_set():
            if self._take_woken():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._woken.wait(remaining if slice_ is None else min(remaining, slice_))
        return False

    def _take_woken(self) -> bool:
        """Whether `wake()` was called since the last look (it is cleared)."""
        if not self._woken.is_set():
            return False
        self._woken.clear()
        return True

    def _listen(self, deadline: float) -> bool:
        assert self._wake is not None
        while not self.stop.is_set():
            if self._take_woken():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if len(self.connected) < len(self.listeners):  # try again to connect soon
                remaining = min(remaining, max(self._retry_at - time.monotonic(), 0.0))
            if not isinstance(self.stop, StopEvent):  # a plain Event cannot interrupt
                remaining = min(remaining, _PLAIN_EVENT_SLICE)
            poller = select.poll()
            poller.register(self._wake[0], select.POLLIN)
            by_fd = {}
            for alias in self.connected:
                by_fd[self.listeners[alias].fd] = alias
                poller.register(self.listeners[alias].fd, select.POLLIN)
            ready = poller.poll(remaining * 1000)
            self._clear_wake()
            if self._take([by_fd[fd] for fd, _ in ready if fd in by_fd]) or self._connect():
                return True
        return False

    def _take(self, aliases: list[str]) -> bool:
        """Whether these readable listeners had notifications; drop the ones that died."""
        woken = False
        for alias in aliases:
            try:
                woken |= self.listeners[alias].take() > 0
            except ListenerLost as exc:
                logger.warning(
                    "outbox listener on %r lost its connection (%s); reconnecting",
                    alias,
                    exc,
                    extra={"event": "outbox.listener_lost", "using": alias},
                )
                self._drop(alias)
                self._retry_at = 0.0
        return woken

    def _drop(self, *aliases: str) -> None:
        for alias in aliases:
            self.connected.discard(alias)
            self.listeners[alias].close()

    def _connect(self) -> bool:
        """Connect the listeners missing, if it is time to try; whether any was."""
        if len(self.connected) == len(self.listeners) or time.monotonic() < self._retry_at:
            return False
        connected = False
        for alias, listener in self.listeners.items():
            if alias in self.connected:
                continue
            try:
                listener.connect()
                self.connected.add(alias)
                connected = True
            except Exception as exc:  # the database may be away: poll meanwhile
                self._retry_at = time.monotonic() + _RECONNECT_SECONDS
                logger.warning(
                    "outbox listener could not connect to %r (%s); polling meanwhile",
                    alias,
                    exc,
                    extra={"event": "outbox.listener_connect_failed", "using": alias},
                )
        return connected

    def _interrupt(self) -> None:
        """Called when the stop event is set (from another thread): end the select."""
        wake = self._wake
        if wake is not None:
            # OSError: full (a wake-up is pending anyway) or closed (the wait is over)
            with contextlib.suppress(OSError):
                wake[1].send(b"\0")

    def _clear_wake(self) -> None:
        assert self._wake is not None
        with contextlib.suppress(BlockingIOError):  # nothing (more) to read
            while self._wake[0].recv(4096):
                pass
