"""Delivering the shards of one window on several threads at once.

A drain with `OUTBOX_CONCURRENCY` above 1 hands each window to a pool of slot threads,
each with database connections of its own. A slot takes the next shard of the window and
delivers its groups one call at a time, in order, exactly as the drain's own thread
would; so one shard is never delivered by two slots, and a slow shard holds one slot
only. The drain's thread waits, and settles the window as one round once its shards are
done: the settle stays one batch, whatever the concurrency.

Receivers that return at once gain nothing from threads, so a window starts on one slot;
the others join as soon as a call takes a millisecond or more, and from then on every
window of the drain starts on all of them (`outbox.engine.shard_tasks`). A shard still
in a call when the rest of its window is done is carved out: the window is settled
without it, and `outbox.engine.stragglers` settles it later, or gives its call up at
`OUTBOX_RECEIVER_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connections

from outbox.backends.base import Group
from outbox.conf import outbox_settings
from outbox.engine.eventloop import AwaitedShards, LazyEventLoop
from outbox.engine.shard_tasks import Abandoned, ShardTask
from outbox.engine.window_run import NewDelivery, WindowRun
from outbox.shards import ShardKey

_TICK_SECONDS = 0.02

_stuck_lock = threading.Lock()
_stuck_in_process: Counter[object] = Counter()  # every pool's stuck threads, by table


def stuck_receivers() -> int:
    """The receiver threads of this process still in a call given up at the timeout."""
    with _stuck_lock:
        return sum(_stuck_in_process.values())


def _count_stuck(key: object, change: int) -> int:
    with _stuck_lock:
        _stuck_in_process[key] += change
        return _stuck_in_process[key]


class SlotPool:
    """Up to `size` slot threads; a thread whose call was given up is replaced."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.event_loop = LazyEventLoop()  # where the slots await async receivers
        self.awaited = AwaitedShards(self.event_loop, size)  # shards of async ones only
        self.stuck = 0  # threads still in a call that was given up
        self._runs: queue.SimpleQueue[WindowRun | None] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        # What to call when a given-up call returns, by the thread that ran it.
        self._on_return: dict[threading.Thread, tuple[object, Callable[[int], None]]] = {}
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
                # here; the next call opens a new one. Working ones are kept for the
                # pool's life, as the drain keeps its own.
                for connection in connections.all(initialized_only=True):
                    if connection.errors_occurred and not connection.is_usable():
                        connection.close()
        except Abandoned:
            with self._lock:
                self.stuck -= 1
                key, on_return = self._on_return.pop(threading.current_thread())
            on_return(_count_stuck(key, -1))
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            connections.close_all()  # this slot's own connections

    def abandon(self, task: ShardTask, key: object, on_return: Callable[[int], None]) -> int:
        """Give up `task`'s running call: its thread no longer counts as a slot. Returns
        the threads stuck in the process for `key` (a table) now; `on_return` is given
        that count again once the call returns."""
        with self._lock:
            self.stuck += 1
            thread = task.thread
            assert thread is not None  # the task is in a call
            # The thread ends when the call returns; a new one may take its place now.
            self._threads.discard(thread)
            self._on_return[thread] = (key, on_return)
        return _count_stuck(key, 1)


def deliver_window(
    pool: SlotPool,
    shards: list[tuple[ShardKey, list[Group]]],
    new_delivery: NewDelivery,
    *,
    start_wide: bool,
    stopping: threading.Event,
) -> WindowRun:
    """Deliver `shards` on the pool; return once all are delivered, or carved out as
    stragglers (`run.carved`). Stopping drops the shards no slot has taken yet and
    carves out those still in a call."""
    run = WindowRun(shards, new_delivery, bulk=not start_wide, awaited=pool.awaited)
    wide = start_wide
    pool.help(run, pool.size if wide else 1)
    dropped = False
    while not run.done.wait(_TICK_SECONDS):
        now = time.monotonic()
        if not wide and run.calls_slow(now):
            run.widen()
            pool.help(run, pool.size - 1)
            wide = True
        if stopping.is_set() and not dropped:
            run.drop_queued()
            dropped = True
        if dropped or run.waiting_on_stragglers(now):
            run.carve()
    return run


@contextmanager
def kept_slots(concurrency: int | None) -> Iterator[SlotPool | None]:
    """A pool of slot threads for a long-running worker's drains (None: concurrency 1),
    so a loop neither starts threads nor opens their connections again every round;
    ended on exit."""
    size = concurrency or outbox_settings.CONCURRENCY
    pool = SlotPool(size) if size > 1 else None
    try:
        yield pool
    finally:
        if pool is not None:
            pool.close()
