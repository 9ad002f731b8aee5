"""The drain worker: the one loop of every entry point, and how it waits while idle.
Each part below needs only the parts above it.

Waiting for a write
-------------------
How an idle drain loop waits: until a table it drains is written to, the poll interval
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

The worker
----------
DrainWorker: the one drain loop of every entry point (command, Celery, Django Tasks),
with its time budget, graceful stop and signal handling.

The drain runs in a daemon thread; the calling thread waits for it and turns stop
requests and the time budget into the Drainer's stop event. A first stop request: claim
nothing new, let the receiver in flight finish within OUTBOX_GRACEFUL_TIMEOUT_SECONDS,
release the unfinished leases at once (the Drainer does that once `stop` is set). A
second one, or the graceful timeout passing: stop waiting, report the run abandoned; the
process exits around the drain thread and that shard's lease expires by itself.

A stop request only appends to a list and sets a flag, as a signal handler must never
take a lock (not even `Event.set()`'s); the waiting thread polls the list.
"""

from __future__ import annotations

import contextlib
import logging
import select
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import ClassVar

from django.db import InterfaceError, OperationalError, connections, router

from outbox.backends.listener import ListenerLost, WakeListener
from outbox.backends.select import listeners
from outbox.conf import outbox_settings
from outbox.engine.drain import Drainer, drain_outboxes
from outbox.engine.pipeline import DrainOutcome, DrainStats, StopRequest
from outbox.engine.slots import KeptStragglers, SlotPool, kept_slots
from outbox.exceptions import DrainInTransaction
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey

# --- Waiting for a write ------------------------------------------------------------

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
            remaining = self._time_left(deadline)
            if remaining is None or remaining <= 0:
                return remaining is None
            self._woken.wait(remaining if slice_ is None else min(remaining, slice_))
        return False

    def _time_left(self, deadline: float) -> float | None:
        """None when `wake()` was called since the last look (it is cleared); else the
        seconds left before `deadline` (none left: 0 or less)."""
        if self._woken.is_set():
            self._woken.clear()
            return None
        return deadline - time.monotonic()

    def _listen(self, deadline: float) -> bool:
        assert self._wake is not None
        while not self.stop.is_set():
            remaining = self._time_left(deadline)
            if remaining is None or remaining <= 0:
                return remaining is None
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


# --- The worker ---------------------------------------------------------------------


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_SECONDS = 0.05


class DrainWorker:
    """Drains outbox tables (or `shards` of one table) once, or with `loop` until
    stopped, within `max_seconds`. One run at a time; `request_stop()` is safe from any
    thread and from signal handlers."""

    # The workers running in this process, for `stop_all()`: Celery's warm shutdown
    # reaches a pool process as a signal, and that handler has no other way to find the
    # drains of the tasks running there. Weak, so a finished worker is never kept.
    _running: ClassVar[weakref.WeakSet[DrainWorker]] = weakref.WeakSet()
    # Rows retired by this process's finished runs (`rows_retired`).
    _retired_before: ClassVar[int] = 0
    _retired_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        models: Sequence[type[OutboxBase]] | None = None,
        *,
        using: str | None = None,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
        shards: Sequence[ShardKey] | None = None,
        reservation: str | None = None,
        loop: bool = False,
        max_seconds: float | None = None,
        progress_every: float = 0.0,
        on_progress: Callable[[DrainStats, float], None] | None = None,
        on_stop: Callable[[StopRequest], None] | None = None,
        heartbeat_every: float = 0.0,
        on_heartbeat: Callable[[DrainStats, float], None] | None = None,
        on_round: Callable[[], None] | None = None,
        concurrency: int | None = None,
    ) -> None:
        self.models = list(models) if models else None  # None: every table, found at run
        self.using = using
        self.scopes = scopes
        self.identifiers = identifiers
        self.loop = loop
        self.concurrency = concurrency  # None: OUTBOX_CONCURRENCY
        self.max_seconds = max_seconds
        self.progress_every = progress_every
        self.on_progress = on_progress
        self.on_stop = on_stop
        # Called from the waiting thread every `heartbeat_every` seconds, busy or idle,
        # with the running totals: a long-running loop says it is alive.
        self.heartbeat_every = heartbeat_every
        self.on_heartbeat = on_heartbeat
        # Called from the drain thread after each round, busy or idle (a liveness file).
        self.on_round = on_round
        self._total = DrainStats()
        # A fan-out task's shards of its one table; their reservation is given back first.
        self.shards = list(shards) if shards is not None else None
        self.reservation = reservation
        self._stop = StopEvent()  # also ends the idle loop's wait (`Waiter`, above)
        self._requests: list[tuple[int | None, float]] = []
        self._result: DrainStats | BaseException | None = None  # of the drain thread
        self.started_at: float | None = None  # time.monotonic() of the run under way

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Stop gracefully; a second request forces. Takes no lock (see the module doc),
        so it is a signal handler as it stands."""
        self._requests.append((signum, time.monotonic()))
        self._stop.requested = True

    @classmethod
    def running(cls) -> tuple[DrainWorker, ...]:
        """The workers running in this process now (a task worker's liveness file)."""
        return tuple(cls._running)

    @classmethod
    def rows_retired(cls) -> int:
        """Rows retired by the drains of this process since it started: the finished
        runs' and, as of their last round, the running ones' (the drain's beacon)."""
        with cls._retired_lock:
            return cls._retired_before + sum(w._total.rows_retired for w in tuple(cls._running))

    @classmethod
    def stop_all(cls) -> None:
        """Request a stop of every worker running in this process; signal-handler safe."""
        for worker in tuple(cls._running):
            worker.request_stop()

    @classmethod
    def stop_all_on(cls, signum: int) -> None:
        """From now on, `signum` stops every worker of this process (main thread only)."""
        signal.signal(signum, lambda received, frame: cls.stop_all())

    @contextmanager
    def handling_signals(self, *, pass_on: bool = False) -> Iterator[None]:
        """Inside, SIGTERM/SIGINT stop this worker (a second one forces); outside the
        main thread this does nothing. The replaced handlers are put back on exit; with
        `pass_on`, the first signal received is then handed to the handler it replaced,
        so a task worker's own shutdown runs once the drain has stopped."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = len(self._requests)
        previous = {signum: signal.signal(signum, self.request_stop) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            received = [signum for signum, _ in self._requests[before:] if signum]
            handler = previous[signal.Signals(received[0])] if pass_on and received else None
            if callable(handler):
                handler(received[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(received[0])

    def run(self) -> DrainOutcome:
        """Drain in a thread of its own; wait for it, turning stop requests and the time
        budget into its stop event. Raises what the drain raised."""
        self._refuse_open_transaction()
        started = self.started_at = time.monotonic()
        deadline = started + self.max_seconds if self.max_seconds else None
        self._result = None
        self._total = DrainStats()
        thread = threading.Thread(
            target=self._drain_thread, args=(deadline,), name="outbox-drain", daemon=True
        )
        DrainWorker._running.add(self)
        try:
            if self._requests:
                self._stop.set()
            thread.start()
            outcome = self._wait(thread, deadline)
        finally:
            with DrainWorker._retired_lock:
                DrainWorker._retired_before += self._total.rows_retired
                DrainWorker._running.discard(self)
        if isinstance(self._result, BaseException) and not outcome.abandoned:
            raise self._result
        if isinstance(self._result, DrainStats) and not outcome.abandoned:
            outcome.stats = self._result
        return outcome

    def _refuse_open_transaction(self) -> None:
        """The drain thread has connections of its own, so the Drainer cannot see the
        caller's transaction: refuse here, where it is open."""
        for model in self.models or outbox_models():
            alias = self.using or router.db_for_write(model)
            if connections[alias].in_atomic_block:
                raise DrainInTransaction.refusing(model._meta.label, alias)

    def _wait(self, thread: threading.Thread, deadline: float | None) -> DrainOutcome:
        outcome = DrainOutcome()
        seen = 0
        started = next_beat = time.monotonic()
        while thread.is_alive():
            thread.join(_POLL_SECONDS)
            seen = self._take_requests(seen, outcome)
            if self.on_heartbeat and self.heartbeat_every and time.monotonic() >= next_beat:
                if next_beat > started:  # not at the very start
                    self.on_heartbeat(self._total, time.monotonic() - started)
                next_beat += self.heartbeat_every
            if deadline is not None and time.monotonic() >= deadline:
                self._stop.set()
            if thread.is_alive() and self._grace_over():
                outcome.abandoned = True
                return outcome
        self._take_requests(seen, outcome)
        return outcome

    def _take_requests(self, seen: int, outcome: DrainOutcome) -> int:
        """Act on the stop requests that came in since the last look."""
        requests = self._requests[:]
        for index in range(seen, len(requests)):
            signum, at = requests[index]
            outcome.stop = StopRequest(signum, index > 0, at - requests[0][1])
            self._stop.set()
            if self.on_stop is not None:
                self.on_stop(outcome.stop)
        return len(requests)

    def _grace_over(self) -> bool:
        """Whether to stop waiting for the receiver in flight (and say so)."""
        requests = self._requests[:]
        waited = time.monotonic() - requests[0][1] if requests else 0.0
        forced = len(requests) > 1
        if not forced and waited <= outbox_settings.GRACEFUL_TIMEOUT_SECONDS:
            return False
        logger.warning(
            "outbox drain still in a receiver %.1fs after the stop request (%s); "
            "stopping without it, its shard's lease will expire",
            waited,
            "forced by a second request" if forced else "graceful timeout",
            extra={"event": "outbox.graceful_timeout", "elapsed": round(waited, 3)},
        )
        return True

    def _drain_thread(self, deadline: float | None) -> None:
        started = time.monotonic()
        try:
            stats = self._drain_shards() if self.shards is not None else self._drain(deadline)
            stats.seconds = time.monotonic() - started
            self._total = self._result = stats
        except BaseException as exc:  # handed to the waiting thread
            self._result = exc
        finally:
            connections.close_all()

    def _drain_shards(self) -> DrainStats:
        assert self.models and self.shards is not None
        drainer = Drainer(self.models[0], self.using, stop=self._stop, concurrency=self.concurrency)
        if self.reservation:
            drainer.unreserve(self.reservation, self.shards)
        if self._stop.is_set():  # stopping already: claim nothing
            return DrainStats()
        return drainer.drain_shards(self.shards)

    def _drain(self, deadline: float | None) -> DrainStats:
        """Drain once, or with `loop` until stopped (one pool of slot threads serving
        every round), in slices no longer than the progress interval."""
        started = time.monotonic()
        total = self._total = DrainStats()
        # An idle loop waits for a write to its tables (LISTEN/NOTIFY) or the interval.
        waiter = Waiter(self.models, self.using, self._stop, listen=self.loop)
        with waiter, kept_slots(self.concurrency) as slots:
            # A loop's calls still running after their round go on across rounds: a
            # round never waits for them, and one landing ends the wait, to settle it.
            # (A one-shot drain waits for its own, claiming other shards meanwhile.)
            stragglers = None
            if slots is not None and self.loop:
                stragglers = KeptStragglers(slots, on_land=waiter.wake)
            try:
                self._rounds(deadline, slots, stragglers, waiter, started)
            except BaseException:
                if stragglers is not None:
                    stragglers.abandon(total)  # what it cannot settle is logged
                raise
            if stragglers is not None:
                stragglers.close(total)
        return total

    def _rounds(
        self,
        deadline: float | None,
        slots: SlotPool | None,
        stragglers: KeptStragglers | None,
        waiter: Waiter,
        started: float,
    ) -> None:
        total = self._total
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            slice_end = time.monotonic() + self.progress_every if self.progress_every else None
            if deadline is not None:
                slice_end = min(slice_end or deadline, deadline)
            stats = self._drain_round(slice_end, slots, stragglers)
            total.add(stats)
            if self.on_round is not None:
                self.on_round()
            cut_short = slice_end is not None and time.monotonic() >= slice_end
            if cut_short and stats.shards and self.on_progress is not None:
                self.on_progress(total, time.monotonic() - started)
            if not (cut_short and stats.shards) and not self.loop:
                break
            # After a round that delivered, look again at once, unless every
            # write since its last claim is told to the wait anyway.
            if not stats.shards or (not cut_short and waiter.hears_every_write):
                waiter.wait(outbox_settings.LOOP_INTERVAL_SECONDS)

    def _drain_round(
        self, deadline: float | None, slots: SlotPool | None, stragglers: KeptStragglers | None
    ) -> DrainStats:
        try:
            return drain_outboxes(
                self.models,
                using=self.using,
                scopes=self.scopes,
                identifiers=self.identifiers,
                deadline=deadline,
                stop=self._stop,
                # At concurrency 1 `slots` is None: without the value, each drain would
                # start a pool of OUTBOX_CONCURRENCY slot threads of its own.
                concurrency=self.concurrency,
                slots=slots,
                stragglers=stragglers,
                wait_for_others=not self.loop,
                gather=outbox_settings.LOOP_GATHER_SECONDS if self.loop else 0.0,
            )
        except (OperationalError, InterfaceError):
            if not self.loop:
                raise
            # A lost connection must not end a long-running drain: drop this thread's
            # connections; leases of the interrupted batch expire by themselves.
            logger.warning(
                "outbox drain lost its database connection; reconnecting",
                exc_info=True,
                extra={"event": "outbox.drain_reconnect"},
            )
        connections.close_all()
        return DrainStats()
