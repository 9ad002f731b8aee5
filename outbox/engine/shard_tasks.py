"""What a slot delivers: a `ShardTask` is one shard; a `BulkTask` is a window's shards
taken in turn, while receivers return at once, into one round with no object per shard
(`outbox.engine.window_run` queues them). Either way one shard is delivered by one slot,
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
from outbox.engine.rounds import Round
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
        "on_loop",
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
        self.on_loop = False  # delivered by a coroutine on the drain's loop, no thread
        self.error: BaseException | None = None
        self.on_finish: Callable[[ShardTask], None] | None = None
        # A carved bulk task's deliveries of other shards, settled with the window.
        self.window_part: Round | None = None

    def begin_call(self, group: Group) -> float:
        self.group = group
        started = self.receiver_started = time.monotonic()
        return started

    def end_call(self) -> None:
        """After each call: a call given up meanwhile ends the task here.

        Lock-free unless the task is detached: `carve` marks it detached before it
        looks at `receiver_started`, so a call ending while the drain carves or gives
        it up waits here for the lock, and the drain sees a round that stands still.
        """
        started, self.receiver_started = self.receiver_started, None
        if started is not None:
            self.calls += 1
            self.call_seconds += time.monotonic() - started
        if self.detached:
            with self.lock:
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

    __slots__ = ("reserved", "snapshot")

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(ShardKey("", 0, 0), [], lock)
        self.snapshot: Round | None = None
        # Shards taken from the queue ahead, a few at a time, so that the hot path
        # takes the lock once per few shards; handed back when other slots join.
        self.reserved: deque[tuple[ShardKey, list[Group]]] = deque()

    def carve(self) -> bool:
        """Only while a call runs is the round still: then everything but the current
        shard goes to the window, and this shard becomes a straggler."""
        self.detached = True  # first: see `end_call`
        if self.receiver_started is None:
            self.detached = False
            return False
        self.snapshot = self.round.copy()
        self.window_part = self.snapshot.without(self.shard)
        return True

    def straggler_round(self) -> Round:
        assert self.snapshot is not None
        return self.round.only(self.shard, since=self.snapshot)
