"""One window's shards queued for the slots (`WindowRun`): which slot takes which
shard, when the window is done, and which tasks are carved out of it.

While receivers return at once, one `BulkTask` takes the queued shards a few at a time
(`RESERVE`); once calls are seen to wait, `widen` hands its reserve back and every slot
takes one shard at a time as a `ShardTask` of its own.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from outbox.backends.base import Group
from outbox.engine.rounds import Round
from outbox.engine.shard_tasks import (
    STALLED_CALL_SECONDS,
    STRAGGLER_SECONDS,
    Abandoned,
    BulkTask,
    ShardTask,
)
from outbox.shards import ShardKey

# How many queued shards the bulk task takes at once.
RESERVE = 32


ShardDelivery = Callable[[ShardTask, ShardKey, list[Group], Round], None]
"""Delivers one shard's groups in order into a round (the batch worker's loop)."""

NewDelivery = Callable[[], ShardDelivery]
"""Makes the delivery one slot uses for one window (its own receiver lookups)."""


class WindowRun:
    """One window's shards, queued for the slots, and the tasks working them."""

    def __init__(
        self, shards: list[tuple[ShardKey, list[Group]]], new_delivery: NewDelivery, *, bulk: bool
    ) -> None:
        self.queued = deque(shards)
        self.new_delivery = new_delivery
        self.lock = threading.Lock()
        self.bulk = BulkTask(self.lock) if bulk and shards else None
        self.running: list[ShardTask] = []
        self.finished: list[ShardTask] = []
        self.carved: list[ShardTask] = []
        self.emptied_at: float | None = None
        self.slow = False  # a finished task's calls were slow
        self.widened = False  # other slots have joined the bulk task
        self.done = threading.Event()
        # Shards no task has taken, and the tasks still working: queued shards plus
        # the bulk task, which takes over the count of every shard it pops.
        self._unfinished = len(shards) + (self.bulk is not None)
        if not self._unfinished:  # a window whose shards had nothing left to read
            self.done.set()

    def work(self) -> None:
        """On a slot: deliver queued shards until none is left."""
        with self.lock:
            bulk = self.bulk if self.bulk is not None and self.bulk.thread is None else None
            if bulk is not None:
                self._start(bulk)
            elif not self.queued:
                return
        deliver = self.new_delivery()
        if bulk is not None:
            self._work_bulk(bulk, deliver)
        while (task := self._take()) is not None:
            self._deliver(deliver, task, task.shard, task.groups)
            self._finish(task)

    def _take(self) -> ShardTask | None:
        with self.lock:
            if not self.queued:
                return None
            shard, groups = self._pop()
            task = ShardTask(shard, groups, self.lock)
            self._start(task)
            return task

    def _work_bulk(self, bulk: BulkTask, deliver: ShardDelivery) -> None:
        """The hot path of receivers that return at once: the lock is taken once per
        `RESERVE` shards, and nothing is allocated per shard."""
        reserved, into = bulk.reserved, bulk.round
        try:
            while True:
                try:  # popped here or handed back by `widen`, never both
                    bulk.shard, groups = reserved.popleft()
                except IndexError:
                    if self._reserve(bulk):
                        continue
                    break
                if not reserved:
                    self._note_emptied()
                deliver(bulk, bulk.shard, groups, into)
        except Abandoned:
            raise  # the drain has settled this shard already; the slot ends
        except BaseException as exc:
            bulk.error = exc  # raised in the drain's thread
            self.drop_queued()  # the error ends the window, as on the drain's thread
        self._finish(bulk)

    def _reserve(self, bulk: BulkTask) -> bool:
        """Move the next shards from the queue to the bulk task (one once others help)."""
        with self.lock:
            if bulk.detached or not self.queued:
                return False
            take = 1 if self.widened else RESERVE
            while self.queued and take:
                bulk.reserved.append(self.queued.popleft())
                take -= 1
                self._unfinished -= 1  # the shard is the bulk task's now
            return True

    def _note_emptied(self) -> None:
        with self.lock:
            if not self.queued and self.emptied_at is None:
                self.emptied_at = time.monotonic()

    def widen(self) -> None:
        """Other slots join: the shards the bulk task reserved go back to the queue."""
        with self.lock:
            self.widened = True
            self._hand_back()

    def _hand_back(self) -> None:
        if self.bulk is None:
            return
        reserved = self.bulk.reserved
        while True:
            try:
                item = reserved.pop()
            except IndexError:
                return
            self.queued.appendleft(item)
            self._unfinished += 1

    def _pop(self) -> tuple[ShardKey, list[Group]]:
        item = self.queued.popleft()
        if not self.queued:
            self.emptied_at = time.monotonic()
        return item

    def _start(self, task: ShardTask) -> None:
        task.thread = threading.current_thread()
        self.running.append(task)

    @staticmethod
    def _deliver(
        deliver: ShardDelivery, task: ShardTask, shard: ShardKey, groups: list[Group]
    ) -> None:
        try:
            deliver(task, shard, groups, task.round)
        except Abandoned:
            raise  # the drain has settled this shard already; the slot ends
        except BaseException as exc:
            task.error = exc  # raised in the drain's thread

    def _finish(self, task: ShardTask) -> None:
        with self.lock:
            task.finished = True
            self.slow = self.slow or task.slow
            self.running.remove(task)
            landed = task.on_finish if task.detached else None
            if not task.detached:
                self.finished.append(task)
                self._count_done(1)
        if landed is not None:
            landed(task)

    def _count_done(self, units: int) -> None:
        self._unfinished -= units
        if not self._unfinished:
            self.done.set()

    def drop_queued(self) -> None:
        """Stopping: the shards no slot has taken are not delivered (they are released)."""
        with self.lock:
            if self.bulk is not None:
                self.bulk.reserved.clear()  # counted as the bulk task's already
            dropped = len(self.queued)
            self.queued.clear()
            if self.bulk is not None and self.bulk.thread is None:
                dropped += 1  # no slot took the bulk task: it never runs
                self.bulk = None
            if dropped:
                self._count_done(dropped)

    def carve(self) -> None:
        """Detach the tasks still in a call: the window is settled without their shards.
        Only once the queue and the bulk task's reserve are empty (or dropped)."""
        with self.lock:
            for task in self.running:
                if not task.finished and not task.detached and task.carve():
                    self.carved.append(task)
                    self._count_done(1)

    def calls_slow(self, now: float) -> bool:
        """A call took, or has been running for, SLOW_CALL_SECONDS or more."""
        with self.lock:
            running = list(self.running)
        return self.slow or any(
            task.slow or task.running_for(now) >= STALLED_CALL_SECONDS for task in running
        )

    def waiting_on_stragglers(self, now: float) -> bool:
        emptied = self.emptied_at
        return emptied is not None and now - emptied >= STRAGGLER_SECONDS
