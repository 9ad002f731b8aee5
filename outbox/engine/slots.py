"""Delivering the shards of one window on several threads at once.

A drain with `OUTBOX_CONCURRENCY` above 1 hands each window to a pool of slot threads,
each with database connections of its own. A slot takes the next shard of the window and
delivers its groups one call at a time, in order, exactly as the drain's own thread
would; so one shard is never delivered by two slots, and a slow shard holds one slot
only. The drain's thread waits, and settles the window as one round once its shards are
done: the settle stays one batch, whatever the concurrency.

Receivers that return at once gain nothing from threads and would pay for the handover
of every shard, so a window starts on one slot; the others join as soon as a call takes
`SLOW_CALL_SECONDS` or more, and from then on every window of the drain starts on all of
them.

A shard still running `STRAGGLER_SECONDS` after the last queued shard was taken is
carved out of the window (`ShardTask.detached`): the window is settled without it and
the drain goes on, while the slot finishes that shard; `outbox.engine.stragglers` settles
it, or gives its call up at `OUTBOX_RECEIVER_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from django.db import connections

from outbox.backends.base import Group
from outbox.engine.eventloop import LazyEventLoop
from outbox.engine.stats import Round
from outbox.shards import ShardKey

# A call this long means the receivers wait on something: wake the other slots.
SLOW_CALL_SECONDS = 0.001
# How long the drain waits for a window's last running shards before carving them out.
STRAGGLER_SECONDS = 0.5
_TICK_SECONDS = 0.02


class Abandoned(BaseException):
    """Unwinds a slot whose call was given up (timed out) once that call returns.

    A BaseException, so the engine's `except Exception` around receivers lets it pass.
    """


class ShardTask:
    """One shard of a window, delivered by one slot: what it did (`round`), the call
    running now (`receiver_started`, `group`), and whether the drain has carved it out
    (`detached`) or given its call up (`abandoned`)."""

    def __init__(self, shard: ShardKey, groups: list[Group]) -> None:
        self.shard = shard
        self.groups = groups
        self.round = Round()
        self.lock = threading.Lock()
        self.receiver_started: float | None = None
        self.group: Group | None = None
        self.finished = False
        self.detached = False
        self.abandoned = False
        self.slow = False  # a call of this task took SLOW_CALL_SECONDS or more
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.on_finish: Callable[[ShardTask], None] | None = None

    def begin_call(self, group: Group) -> float:
        self.group = group
        started = self.receiver_started = time.monotonic()
        return started

    def end_call(self) -> None:
        """After each call: a call given up meanwhile ends the task here."""
        with self.lock:
            started, self.receiver_started = self.receiver_started, None
            if started is not None and time.monotonic() - started >= SLOW_CALL_SECONDS:
                self.slow = True
            if self.abandoned:
                raise Abandoned

    def running_for(self, now: float) -> float:
        started = self.receiver_started
        return now - started if started is not None else 0.0


ShardDelivery = Callable[[ShardTask], None]
"""Delivers a task's groups in order into `task.round` (the batch worker's loop)."""


class WindowRun:
    """One window's shards, queued for the slots, and the tasks they finished."""

    def __init__(self, tasks: list[ShardTask], deliver: ShardDelivery) -> None:
        self.queued: deque[ShardTask] = deque(tasks)
        self.deliver = deliver
        self.running: list[ShardTask] = []
        self.finished: list[ShardTask] = []
        self.emptied_at: float | None = None
        self.slow = False  # a call took SLOW_CALL_SECONDS or more
        self.lock = threading.Lock()
        self.done = threading.Event()
        self._unfinished = len(tasks)
        if not tasks:  # a window whose shards had nothing left to read
            self.done.set()

    def work(self) -> None:
        """On a slot: deliver queued shards until none is left."""
        while True:
            with self.lock:
                if not self.queued:
                    return
                task = self.queued.popleft()
                task.thread = threading.current_thread()
                self.running.append(task)
                if not self.queued:
                    self.emptied_at = time.monotonic()
            self._run(task)

    def _run(self, task: ShardTask) -> None:
        try:
            self.deliver(task)
        except Abandoned:
            raise  # the drain has settled this shard already; the slot ends
        except BaseException as exc:
            task.error = exc  # raised in the drain's thread
        with self.lock, task.lock:
            task.finished = True
            self.running.remove(task)
            landed = task.on_finish if task.detached else None
            if not task.detached:
                self.finished.append(task)
                self._unfinished -= 1
                if not self._unfinished:
                    self.done.set()
        if landed is not None:
            landed(task)

    def drop_queued(self) -> None:
        """Stopping: the shards no slot has taken are not delivered (they are released)."""
        with self.lock:
            self._unfinished -= len(self.queued)
            self.queued.clear()
            if not self._unfinished:
                self.done.set()

    def carve(self) -> list[ShardTask]:
        """Detach the shards still running: the window is settled without them."""
        with self.lock:
            carved = []
            for task in self.running:
                with task.lock:
                    if not task.finished:
                        task.detached = True
                        carved.append(task)
            self._unfinished -= len(carved)
            return carved

    def calls_slow(self, now: float) -> bool:
        with self.lock:
            tasks = [*self.running, *self.finished]
        return any(task.slow or task.running_for(now) >= SLOW_CALL_SECONDS for task in tasks)

    def waiting_on_stragglers(self, now: float) -> bool:
        emptied = self.emptied_at
        return emptied is not None and now - emptied >= STRAGGLER_SECONDS


class SlotPool:
    """Up to `size` slot threads; a thread whose call was given up is replaced."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.event_loop = LazyEventLoop()  # where the slots await async receivers
        self.stuck = 0  # threads still in a call that was given up
        self._runs: queue.SimpleQueue[WindowRun | None] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._lock = threading.Lock()

    def help(self, run: WindowRun, slots: int) -> None:
        """Have `slots` slots (at most the pool's size) work on `run`."""
        slots = min(slots, self.size)
        with self._lock:
            spawn = min(slots - self._idle, self.size - len(self._threads))
            for _ in range(max(spawn, 0)):
                thread = threading.Thread(target=self._slot, name="outbox-slot", daemon=True)
                self._threads.add(thread)
                thread.start()
        for _ in range(slots):
            self._runs.put(run)

    def close(self) -> None:
        """End the slot threads once idle and wait for them (not for stuck ones)."""
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._runs.put(None)
        for thread in threads:
            thread.join()
        self.event_loop.close()

    def _slot(self) -> None:
        self.event_loop.serve_this_thread()
        try:
            while True:
                with self._lock:
                    self._idle += 1
                run = self._runs.get()
                with self._lock:
                    self._idle -= 1
                if run is None:
                    return
                run.work()
                # A connection broken meanwhile (server restart, killed) is dropped
                # here, as Django does between requests; the next call opens a new one.
                for connection in connections.all(initialized_only=True):
                    connection.close_if_unusable_or_obsolete()
        except Abandoned:
            with self._lock:
                self.stuck -= 1
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            connections.close_all()  # this slot's own connections

    def abandon(self, task: ShardTask) -> None:
        """Give up `task`'s running call: its thread no longer counts as a slot."""
        with self._lock:
            self.stuck += 1
            # The thread ends when the call returns; a new one may take its place now.
            if task.thread is not None:
                self._threads.discard(task.thread)


def deliver_window(
    pool: SlotPool,
    tasks: list[ShardTask],
    deliver: ShardDelivery,
    *,
    start_wide: bool,
    stopping: threading.Event,
) -> WindowRun:
    """Deliver `tasks` on the pool; return once all are finished, or once only
    stragglers are left (carved out: `run.finished` excludes them). Stopping drops the
    shards no slot has taken yet."""
    run = WindowRun(tasks, deliver)
    wide = start_wide
    pool.help(run, pool.size if wide else 1)
    dropped = False
    while not run.done.wait(_TICK_SECONDS):
        now = time.monotonic()
        if not wide and run.calls_slow(now):
            pool.help(run, pool.size - 1)
            wide = True
        if stopping.is_set() and not dropped:
            run.drop_queued()
            dropped = True
        if run.waiting_on_stragglers(now) or (dropped and run.running):
            run.carve()
            break
    run.slow = run.slow or wide
    return run
