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
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from outbox.backends.base import Group
from outbox.engine.eventloop import AwaitedShards
from outbox.engine.shard_delivery import ShardDeliverer
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


NewDelivery = Callable[[], ShardDeliverer]
"""Makes the delivery one slot uses for one window (its own receiver lookups)."""


class WindowRun:
    """One window's shards, queued for the slots, and the tasks working them."""

    def __init__(
        self,
        shards: list[tuple[ShardKey, list[Group]]],
        new_delivery: NewDelivery,
        *,
        bulk: bool,
        awaited: AwaitedShards | None = None,
    ) -> None:
        self.queued = deque(shards)
        self.new_delivery = new_delivery
        self.awaited = awaited  # where shards of async receivers only are awaited
        self.lock = threading.Lock()
        self.bulk = BulkTask(self.lock) if bulk and shards else None
        self.running: list[ShardTask] = []
        self.finished: list[ShardTask] = []
        self.carved: list[ShardTask] = []
        self.emptied_at: float | None = None
        self.slow = False  # a finished task's calls were slow
        self.widened = False  # other slots have joined the bulk task
        self.dropped = False  # stopping: no shard is started any more
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
        awaitable = self._awaitable(deliver)
        while (task := self._take()) is not None:
            if awaitable is not None and awaitable(task.groups):
                self._await(task, deliver)
                continue
            self._deliver(deliver, task)
            self._finish(task)

    def _take(self) -> ShardTask | None:
        with self.lock:
            if not self.queued:
                return None
            shard, groups = self._pop()
            task = ShardTask(shard, groups, self.lock)
            self._start(task)
            return task

    def _awaitable(self, deliver: ShardDeliverer) -> Callable[[list[Group]], bool] | None:
        """How to tell a shard to await on the loop; None: none can be."""
        return deliver.awaitable if self.awaited is not None and deliver.any_async else None

    def _own_task(self, shard: ShardKey, groups: list[Group]) -> ShardTask:
        """A task of its own for a shard the bulk task took (to be awaited)."""
        task = ShardTask(shard, groups, self.lock)
        with self.lock:
            self._unfinished += 1
            self.running.append(task)
        return task

    def _await(self, task: ShardTask, deliver: ShardDeliverer) -> None:
        """Deliver a running task's shard by a coroutine on the loop, not on this slot;
        the task finishes when it returns. Stopping while waiting for room: it is not
        delivered (its shard is released with the others)."""
        assert self.awaited is not None
        task.on_loop, task.thread = True, None

        def returned(future: Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                task.error = future.exception()
            self._finish(task)

        if not self.awaited.start(
            lambda: deliver.deliver_on_loop(task), returned, lambda: self.dropped
        ):
            self._finish(task)

    def _work_bulk(self, bulk: BulkTask, deliver: ShardDeliverer) -> None:
        """The hot path of receivers that return at once: the lock is taken once per
        `RESERVE` shards, and nothing is allocated per shard."""
        try:
            deliver.deliver_each(self._bulk_shards(bulk, deliver), bulk.round, bulk)
        except Abandoned:
            raise  # the drain has settled this shard already; the slot ends
        except BaseException as exc:
            bulk.error = exc  # raised in the drain's thread
            self.drop_queued()  # the error ends the window, as on the drain's thread
        self._finish(bulk)

    def _bulk_shards(
        self, bulk: BulkTask, deliver: ShardDeliverer
    ) -> Iterator[tuple[ShardKey, list[Group]]]:
        """The bulk task's shards, one at a time (`bulk.shard` the one delivered now);
        those to be awaited go to the loop instead."""
        reserved, awaitable = bulk.reserved, self._awaitable(deliver)
        while True:
            try:  # popped here or handed back by `widen`, never both
                item = reserved.popleft()
            except IndexError:
                if self._reserve(bulk):
                    continue
                return
            bulk.shard, groups = item
            if not reserved:
                self._note_emptied()
            if awaitable is not None and awaitable(groups):
                self._await(self._own_task(bulk.shard, groups), deliver)
                continue
            yield item

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
    def _deliver(deliver: ShardDeliverer, task: ShardTask) -> None:
        try:
            deliver.deliver(task.shard, task.groups, task.round, task)
        except Abandoned:
            raise  # the drain has settled this shard already; the slot ends
        except BaseException as exc:
            task.error = exc  # raised in the drain's thread

    def _finish(self, task: ShardTask) -> None:
        with self.lock:
            task.finished = True
            # Awaited calls need no slot: their waiting never calls the other slots in.
            self.slow = self.slow or (task.slow and not task.on_loop)
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
            self.dropped = True
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
            (task.slow or task.running_for(now) >= STALLED_CALL_SECONDS) and not task.on_loop
            for task in running
        )

    def waiting_on_stragglers(self, now: float) -> bool:
        emptied = self.emptied_at
        return emptied is not None and now - emptied >= STRAGGLER_SECONDS
