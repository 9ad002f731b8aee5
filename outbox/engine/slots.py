"""Slots: the shards of one window delivered on several threads at once, and the shards
whose calls outlast their window. Each part below needs only the parts above it.

One window's shards, queued for the slots
-----------------------------------------
One window's shards queued for the slots (`WindowRun`): which slot takes which
shard, when the window is done, and which tasks are carved out of it.

While receivers return at once, one `BulkTask` takes the queued shards a few at a time
(`RESERVE`); once calls are seen to wait, `widen` hands its reserve back and every slot
takes one shard at a time as a `ShardTask` of its own.

The slot threads
----------------
Delivering the shards of one window on several threads at once.

A drain with `OUTBOX_CONCURRENCY` above 1 hands each window to a pool of slot threads,
each with database connections of its own. A slot takes the next shard of the window and
delivers its groups one call at a time, in order, exactly as the drain's own thread
would; so one shard is never delivered by two slots, and a slow shard holds one slot
only. The drain's thread waits, and settles the window as one round once its shards are
done: the settle stays one batch, whatever the concurrency.

Receivers that return at once gain nothing from threads, so a window starts on one slot;
the others join as soon as a call takes a millisecond or more, and from then on every
window of the drain starts on all of them (`outbox.engine.delivery`). A shard still
in a call when the rest of its window is done is carved out: the window is settled
without it, and `Stragglers` (below) settles it later, or gives its call up at
`OUTBOX_RECEIVER_TIMEOUT_SECONDS`.

Stragglers and calls that time out
----------------------------------
Shards whose delivery outlasts their window, and receiver calls that time out.

A shard carved out of its window (above) keeps its lease, under a lease
of its own with the window's token that the keeper renews, while its slot finishes it.
The drain settles it once it lands, between its own batches, batching every straggler
that landed meanwhile into one settle per window lease.

A one-shot drain waits for its stragglers before it returns, claiming other shards
meanwhile. A loop keeps them across its rounds instead (`KeptStragglers`): a round ends
as soon as nothing is due, whatever still runs, so neither the next round, nor the other
tables, nor the loop's wait for a write is held by one call; each round settles what
landed, and a landing ends the loop's wait (`on_land`).

A call running past `OUTBOX_RECEIVER_TIMEOUT_SECONDS` is given up: what the shard
delivered before it is settled, the call counts as a failed attempt (`TimeoutError`),
its rows are rescheduled with back-off, and the shard's lease is let go. The thread
cannot be stopped: it is counted as stuck until its call returns, and its result is
then thrown away. Only such a call can overlap a later delivery of the same shard, once
the back-off has passed. Past `OUTBOX_MAX_STUCK_RECEIVERS` stuck threads the drain
raises `StuckReceivers`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connections

from outbox.backends.base import Group, Lease, OutboxBackend
from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.engine.delivery import (
    STALLED_CALL_SECONDS,
    STRAGGLER_SECONDS,
    Abandoned,
    AwaitedShards,
    BulkTask,
    LazyEventLoop,
    ShardDeliverer,
    ShardTask,
    judge,
)
from outbox.engine.pipeline import (
    DrainStats,
    Holding,
    LeaseKeeper,
    Round,
    report_stuck,
    settle_round,
)
from outbox.exceptions import InvalidOutboxMessage, StuckReceivers
from outbox.internals import live_receivers
from outbox.models import OutboxBase
from outbox.shards import ShardKey
from outbox.signals import receiver_id

# --- One window's shards, queued for the slots --------------------------------------

# The windows and pools of this process, weakly: where `running_calls` finds the calls.
_live_lock = threading.Lock()
_live_windows: weakref.WeakSet[WindowRun] = weakref.WeakSet()
_live_pools: weakref.WeakSet[SlotPool] = weakref.WeakSet()

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
        with _live_lock:
            _live_windows.add(self)  # its calls, for `running_calls`

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


# --- The slot threads ---------------------------------------------------------------

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


@dataclass(frozen=True)
class RunningCall:
    """A receiver call running in this process now: its shard and category, for how
    long, and whether it was given up at the timeout (its thread stuck in it)."""

    shard: ShardKey
    category: int | None
    seconds: float
    given_up: bool = False


def running_calls() -> list[RunningCall]:
    """The receiver calls running in this process now, longest first. Read-only and
    without the database, from what the engine keeps anyway: the leases the keeper
    holds (calls on a drain's own thread, stragglers), the live windows' slot tasks and
    the pools' calls given up."""
    with _live_lock:
        windows, pools = list(_live_windows), list(_live_pools)
    calls: dict[int, tuple[Holding | ShardTask, bool]] = {}
    for holding in LeaseKeeper.get().holdings():
        calls[id(holding.call or holding)] = (holding.call or holding, False)
    for window in windows:
        with window.lock:
            running = list(window.running)
        calls.update((id(task), (task, False)) for task in running)
    for pool in pools:
        with pool._lock:
            given_up = list(pool.given_up.values())
        calls.update((id(task), (task, True)) for task in given_up)
    now = time.monotonic()
    found = []
    for call, given in calls.values():
        started, group = call.receiver_started, call.group
        if started is None:
            continue
        shard = group.shard if group is not None else getattr(call, "shard", None)
        if shard is None:
            continue
        category = group.category if group is not None else None
        found.append(RunningCall(shard, category, max(now - started, 0.0), given))
    return sorted(found, key=lambda call: -call.seconds)


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
        self.given_up: dict[threading.Thread, ShardTask] = {}  # their tasks
        self._idle = 0
        self._lock = threading.Lock()
        with _live_lock:
            _live_pools.add(self)

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
                self.given_up.pop(threading.current_thread(), None)
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
            self.given_up[thread] = task
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


# --- Stragglers and calls that time out ---------------------------------------------

logger = logging.getLogger("outbox.engine")

ASYNC_CANCEL_SECONDS = 0.5


class Stragglers:
    """One drain's shards still being delivered after their window was settled."""

    def __init__(
        self, backend: OutboxBackend, model: type[OutboxBase], using: str, pool: SlotPool
    ) -> None:
        self.backend = backend
        self.model = model
        self.using = using
        self.pool = pool
        self._holdings: dict[ShardTask, Holding] = {}
        self._landed: deque[ShardTask] = deque()
        self._wake = threading.Event()
        # Called (from a slot thread) when a straggler lands: a loop's wait ends.
        self.on_land: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        return bool(self._holdings)

    def adopt(self, tasks: list[ShardTask], lease: Lease) -> None:
        """Keep `tasks`' shards leased until their slots finish them."""
        keeper = LeaseKeeper.get()
        for task in tasks:
            own = Lease(lease.token, lease.holder, lease.seconds, [task.shard])
            holding = Holding(self.backend, self.model, own, call=task)
            self._holdings[task] = holding
            keeper.hold(holding)
            with task.lock:
                landed_already = task.finished
                task.on_finish = self._land
            if landed_already:
                self._land(task)

    def _land(self, task: ShardTask) -> None:
        self._landed.append(task)
        self._wake.set()
        if self.on_land is not None:
            self.on_land()

    def settle(self, stats: DrainStats, *, wait: float = 0.0) -> int:
        """Settle the shards that landed and give up the calls past the timeout, after
        waiting up to `wait` seconds for one to land; how many shards were settled."""
        if wait and not self._landed:
            self._wake.wait(wait)
        self._wake.clear()
        rounds: list[tuple[ShardTask, Round]] = []
        while self._landed:
            task = self._landed.popleft()
            with task.lock:
                rounds.append((task, task.straggler_round()))
        given_up = self._time_out()
        stats.timed_out += len(given_up)
        rounds.extend(given_up)
        if rounds:
            self._settle(rounds, stats)
        errors = [task.error for task, _ in rounds if task.error is not None]
        if errors:
            raise errors[0]
        limit = outbox_settings.MAX_STUCK_RECEIVERS
        if limit and self.pool.stuck > limit:
            raise StuckReceivers(
                f"{self.pool.stuck} receiver calls are still running past "
                f"OUTBOX_RECEIVER_TIMEOUT_SECONDS (limit OUTBOX_MAX_STUCK_RECEIVERS={limit})"
            )
        return len(rounds)

    def waited(self, stats: DrainStats) -> bool:
        """Nothing was claimed: while stragglers run, wait a little for one to land,
        settle what landed, and say so (True); else False."""
        if not self.running:
            return False
        self.settle(stats, wait=outbox_settings.LOOP_INTERVAL_SECONDS / 4)
        return True

    def close(self, stats: DrainStats) -> None:
        """Wait for every straggler to land or time out, settling each."""
        while self._holdings:
            self.settle(stats, wait=0.05)

    def abandon(self, stats: DrainStats) -> None:
        """`close` while an error propagates: what fails here is logged, not raised, and
        the leases of shards left unsettled are no longer renewed (they expire)."""
        try:
            self.close(stats)
        except Exception:
            logger.warning("outbox could not settle a straggling shard", exc_info=True)
        finally:
            keeper = LeaseKeeper.get()
            for holding in self._holdings.values():
                keeper.drop(holding)
            self._holdings.clear()

    def _time_out(self) -> list[tuple[ShardTask, Round]]:
        timeout = outbox_settings.RECEIVER_TIMEOUT_SECONDS
        if not timeout:
            return []
        now = time.monotonic()
        given_up = []
        for task in list(self._holdings):
            with task.lock:
                # An async call is cancelled at the timeout itself: leave it that moment.
                late = task.running_for(now) >= timeout + ASYNC_CANCEL_SECONDS
                # A coroutine's call is cancelled at the timeout: none to give up.
                if task.finished or not late or task.abandoned or task.on_loop:
                    continue
                task.abandoned = True
                group = task.group
                round_ = task.straggler_round()
            stuck = self.pool.abandon(task, self.model, on_return=self._report_stuck)
            self._report_stuck(stuck)
            assert group is not None  # a call is running
            names = _receiver_names(self.model, group.category)
            logger.warning(
                "outbox receiver call to %s for shard %s ran past %ss; given up, its thread "
                "is stuck",
                _named(names),
                registry.shard_name(task.shard, "noted"),
                timeout,
                extra={
                    "event": "outbox.receiver_timeout",
                    "shard": str(task.shard),
                    "receivers": names,
                },
            )
            error = TimeoutError(
                f"receiver call to {_named(names)} ran past {timeout}s "
                "(OUTBOX_RECEIVER_TIMEOUT_SECONDS)"
            )
            failed, dead = judge(self.model, group, error, self.using)
            (round_.dead if dead else round_.failures).append(failed)
            round_.receiver_calls += 1
            given_up.append((task, round_))
        return given_up

    def _report_stuck(self, count: int) -> None:
        report_stuck(self.model, count, self.using)

    def _settle(self, rounds: list[tuple[ShardTask, Round]], stats: DrainStats) -> None:
        """One settle per window lease for these shards; then stop renewing them."""
        by_token: dict[str, list[tuple[ShardTask, Round]]] = {}
        for task, round_ in rounds:
            by_token.setdefault(self._holdings[task].lease.token, []).append((task, round_))
        for landed in by_token.values():
            self._settle_lease(landed, stats)

    def _settle_lease(self, landed: list[tuple[ShardTask, Round]], stats: DrainStats) -> None:
        merged = Round()
        for _, round_ in landed:
            merged.merge(round_)
        failed = {failure.shard for failure in merged.failures}
        shards = [task.shard for task, _ in landed]
        done = [key for key in shards if key not in failed and key not in merged.lost]
        window_lease = self._holdings[landed[0][0]].lease
        lease = Lease(window_lease.token, window_lease.holder, window_lease.seconds, shards)
        try:
            settled = settle_round(self.backend, self.model, self.using, lease, merged, done)
        finally:
            keeper = LeaseKeeper.get()
            for task, _ in landed:
                keeper.drop(self._holdings.pop(task))
        merged.add_to(stats, settled.deleted)


def _receiver_names(model: type[OutboxBase], category: int) -> list[str]:
    """The ids of the receivers a call given up may be in: those connected now for the
    group's category, sync ones first as they are called (the thread's own is unknown)."""
    try:
        sync_receivers, async_receivers = live_receivers(
            model.process_signal, registry.category(category)
        )
    except InvalidOutboxMessage:  # a category no scope declares: no receiver to name
        return []
    return [receiver_id(receiver) for receiver in (*sync_receivers, *async_receivers)]


def _named(names: list[str]) -> str:
    if not names:
        return "a receiver no longer connected"
    return names[0] if len(names) == 1 else f"one of {', '.join(names)}"


class KeptStragglers:
    """A loop's stragglers, one `Stragglers` per table and database, kept across its
    rounds on its kept pool of slots; `on_land` is told whenever one lands."""

    def __init__(self, pool: SlotPool, on_land: Callable[[], None] | None = None) -> None:
        self.pool = pool
        self.on_land = on_land
        self._by_table: dict[tuple[str, str], Stragglers] = {}

    def of(self, backend: OutboxBackend, model: type[OutboxBase], using: str) -> Stragglers:
        key = (model._meta.label, using)
        stragglers = self._by_table.get(key)
        if stragglers is None:
            stragglers = self._by_table[key] = Stragglers(backend, model, using, self.pool)
            stragglers.on_land = self.on_land
        return stragglers

    def close(self, stats: DrainStats) -> None:
        """The loop ends: wait for every straggler to land or time out, settling each."""
        for stragglers in self._by_table.values():
            stragglers.close(stats)

    def abandon(self, stats: DrainStats) -> None:
        for stragglers in self._by_table.values():
            stragglers.abandon(stats)


@contextmanager
def on_slots(
    backend: OutboxBackend,
    model: type[OutboxBase],
    using: str,
    size: int,
    kept: SlotPool | None,
    stats: DrainStats,
    kept_stragglers: KeptStragglers | None = None,
) -> Iterator[tuple[SlotPool, Stragglers] | None]:
    """One drain's slot threads (`kept`, the caller's pool, or `size` new ones; None with
    a size of 1) and its stragglers. On leaving: wait for the stragglers, settling each,
    then end the threads of a pool made here; stragglers a loop keeps
    (`kept_stragglers`, on its kept pool) are left running, for its next rounds."""
    if kept is None and size <= 1:
        yield None
        return
    if kept is not None and kept_stragglers is not None:
        yield kept, kept_stragglers.of(backend, model, using)
        return
    slots = kept or SlotPool(size)
    stragglers = Stragglers(backend, model, using, slots)
    try:
        yield slots, stragglers
        stragglers.close(stats)
    except BaseException:
        stragglers.abandon(stats)  # what it cannot settle is logged
        raise
    finally:
        if kept is None:
            slots.close()
