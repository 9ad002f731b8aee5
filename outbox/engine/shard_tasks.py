"""What a slot delivers: the shards of one window, queued, and the tasks working them.

While a drain has seen only receivers that return at once, a window is one `BulkTask`:
one slot takes its shards in turn and records them all in one round, as the drain's own
thread used to, with no object per shard. Once calls are seen to wait (a millisecond or
more on average, see `SLOW_CALL_SECONDS`), the other slots join: each takes the next
queued shard as a `ShardTask` of its own. Either way one shard is delivered by one slot,
one call at a time, in order.

A task still in a call `STRAGGLER_SECONDS` after the last shard was taken from the queue
is carved out (`detached`): the window is settled without its shard, which it finishes
on its own (`outbox.engine.stragglers`). A carved bulk task hands the window what it did
before that shard (`window_part`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from outbox.backends.base import Group
from outbox.engine.stats import Round
from outbox.shards import ShardKey

# Receivers wait on something (wake the other slots) when calls take this long on
# average over a few calls, or one call takes SLOW_ONE_CALL_SECONDS, or is still running
# after STALLED_CALL_SECONDS; waits for the GIL or the garbage collector stay below them.
SLOW_CALL_SECONDS = 0.001
SLOW_ONE_CALL_SECONDS = 0.005
STALLED_CALL_SECONDS = 0.02
# How long the drain waits for a window's last running shards before carving them out.
STRAGGLER_SECONDS = 0.5


class Abandoned(BaseException):
    """Unwinds a slot whose call was given up (timed out) once that call returns.

    A BaseException, so the engine's `except Exception` around receivers lets it pass.
    """


class ShardTask:
    """One shard delivered by one slot: what it did (`round`), the call running now
    (`receiver_started`, `group`), and whether the drain has carved it out (`detached`)
    or given its call up (`abandoned`). `lock` is the window's."""

    __slots__ = (
        "abandoned",
        "call_seconds",
        "calls",
        "detached",
        "error",
        "finished",
        "group",
        "groups",
        "lock",
        "on_finish",
        "receiver_started",
        "round",
        "shard",
        "thread",
        "window_part",
    )

    def __init__(self, shard: ShardKey, groups: list[Group], lock: threading.Lock) -> None:
        self.shard = shard
        self.groups = groups
        self.round = Round()
        self.lock = lock
        self.receiver_started: float | None = None
        self.group: Group | None = None
        self.finished = False
        self.detached = False
        self.abandoned = False
        self.calls = 0
        self.call_seconds = 0.0
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.on_finish: Callable[[ShardTask], None] | None = None
        # A carved bulk task's deliveries of other shards, settled with the window.
        self.window_part: Round | None = None

    def begin_call(self, group: Group) -> float:
        self.group = group
        started = self.receiver_started = time.monotonic()
        return started

    def end_call(self) -> None:
        """After each call: a call given up meanwhile ends the task here."""
        with self.lock:
            started, self.receiver_started = self.receiver_started, None
            if started is not None:
                self.calls += 1
                self.call_seconds += time.monotonic() - started
            if self.abandoned:
                raise Abandoned

    @property
    def slow(self) -> bool:
        """Its calls wait on something (see SLOW_CALL_SECONDS)."""
        calls, seconds = self.calls, self.call_seconds
        return bool(calls) and (
            seconds >= SLOW_ONE_CALL_SECONDS * calls
            or (calls >= 3 and seconds >= SLOW_CALL_SECONDS * calls)
        )

    def running_for(self, now: float) -> float:
        started = self.receiver_started
        return now - started if started is not None else 0.0

    def carve(self) -> bool:
        """Detach this task from its window (under the window's lock); False: not now."""
        self.detached = True
        return True

    def straggler_round(self) -> Round:
        """What this task did that the window's settle left out (under the lock)."""
        return self.round.copy()


class BulkTask(ShardTask):
    """One slot delivering a window's queued shards in turn into one round; `shard` is
    the one it works on now."""

    __slots__ = ("snapshot",)

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(ShardKey("", 0, 0), [], lock)
        self.snapshot: Round | None = None

    def carve(self) -> bool:
        """Only while a call runs is the round still: then everything but the current
        shard goes to the window, and this shard becomes a straggler."""
        if self.receiver_started is None:
            return False
        self.snapshot = self.round.copy()
        self.window_part = self.snapshot.without(self.shard)
        self.detached = True
        return True

    def straggler_round(self) -> Round:
        assert self.snapshot is not None
        return self.round.only(self.shard, since=self.snapshot)


ShardDelivery = Callable[[ShardTask, ShardKey, list[Group], Round], None]
"""Delivers one shard's groups in order into a round (the batch worker's loop)."""


class WindowRun:
    """One window's shards, queued for the slots, and the tasks that worked them."""

    def __init__(
        self, shards: list[tuple[ShardKey, list[Group]]], deliver: ShardDelivery, *, bulk: bool
    ) -> None:
        self.queued = deque(shards)
        self.deliver = deliver
        self.lock = threading.Lock()
        self.bulk = BulkTask(self.lock) if bulk and shards else None
        self.running: list[ShardTask] = []
        self.finished: list[ShardTask] = []
        self.carved: list[ShardTask] = []
        self.emptied_at: float | None = None
        self.slow = False  # a finished task's calls were slow
        self.done = threading.Event()
        # Shards not delivered yet, and the bulk task itself until it has finished.
        self._unfinished = len(shards) + (self.bulk is not None)
        if not self._unfinished:  # a window whose shards had nothing left to read
            self.done.set()

    def work(self) -> None:
        """On a slot: deliver queued shards until none is left."""
        with self.lock:
            bulk = self.bulk if self.bulk is not None and self.bulk.thread is None else None
            if bulk is not None:
                self._start(bulk)
        if bulk is not None:
            self._work_bulk(bulk)
        while (task := self._take()) is not None:
            self._deliver(task, task.shard, task.groups)
            self._finish(task, units=1)

    def _take(self) -> ShardTask | None:
        with self.lock:
            if not self.queued:
                return None
            shard, groups = self._pop()
            task = ShardTask(shard, groups, self.lock)
            self._start(task)
            return task

    def _work_bulk(self, bulk: BulkTask) -> None:
        while True:
            with self.lock:
                if bulk.detached or bulk.error is not None or not self.queued:
                    break
                bulk.shard, groups = self._pop()
            self._deliver(bulk, bulk.shard, groups)
            with self.lock:
                if not bulk.detached:
                    self._count_done(1)
            if bulk.error is not None:
                self.drop_queued()  # the error ends the window, as on the drain's thread
        self._finish(bulk, units=1)

    def _pop(self) -> tuple[ShardKey, list[Group]]:
        item = self.queued.popleft()
        if not self.queued:
            self.emptied_at = time.monotonic()
        return item

    def _start(self, task: ShardTask) -> None:
        task.thread = threading.current_thread()
        self.running.append(task)

    def _deliver(self, task: ShardTask, shard: ShardKey, groups: list[Group]) -> None:
        try:
            self.deliver(task, shard, groups, task.round)
        except Abandoned:
            raise  # the drain has settled this shard already; the slot ends
        except BaseException as exc:
            task.error = exc  # raised in the drain's thread

    def _finish(self, task: ShardTask, units: int) -> None:
        with self.lock:
            task.finished = True
            self.slow = self.slow or task.slow
            self.running.remove(task)
            landed = task.on_finish if task.detached else None
            if not task.detached:
                self.finished.append(task)
                self._count_done(units)
        if landed is not None:
            landed(task)

    def _count_done(self, units: int) -> None:
        self._unfinished -= units
        if not self._unfinished:
            self.done.set()

    def drop_queued(self) -> None:
        """Stopping: the shards no slot has taken are not delivered (they are released)."""
        with self.lock:
            dropped = len(self.queued)
            self.queued.clear()
            if self.bulk is not None and self.bulk.thread is None:
                dropped += 1  # no slot took the bulk task: it never runs
                self.bulk = None
            if dropped:
                self._count_done(dropped)

    def carve(self) -> None:
        """Detach the tasks still in a call: the window is settled without their shards."""
        with self.lock:
            for task in self.running:
                if not task.finished and not task.detached and task.carve():
                    self.carved.append(task)
                    # Its shard; and the bulk task's own unit.
                    self._count_done(1 + isinstance(task, BulkTask))

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
