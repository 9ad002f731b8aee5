"""DrainWorker: the one drain loop of every entry point (command, Celery, Django Tasks),
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

import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import ClassVar

from django.db import InterfaceError, OperationalError, connections, router

from outbox.conf import outbox_settings
from outbox.engine.drain import drain_outboxes
from outbox.engine.rounds import DrainOutcome, DrainStats, StopRequest
from outbox.engine.slots import SlotPool, kept_slots
from outbox.engine.stragglers import KeptStragglers
from outbox.engine.table import Drainer
from outbox.engine.wakeup import StopEvent, Waiter
from outbox.exceptions import DrainInTransaction
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey

logger = logging.getLogger("outbox.engine")

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
        self._stop = StopEvent()  # also ends the idle loop's wait (engine/wakeup.py)
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
            self._result = stats
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
