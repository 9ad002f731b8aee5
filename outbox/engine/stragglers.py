"""Shards whose delivery outlasts their window, and receiver calls that time out.

A shard carved out of its window (`outbox.engine.slots`) keeps its lease, under a lease
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
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import outbox.engine.events as events
from outbox.backends.base import Lease, OutboxBackend
from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.engine.events import shard_named
from outbox.engine.failures import judge
from outbox.engine.leases import Holding, LeaseKeeper, retrying
from outbox.engine.rounds import DrainStats, Round
from outbox.engine.shard_tasks import ShardTask
from outbox.engine.slots import SlotPool
from outbox.exceptions import InvalidOutboxMessage, StuckReceivers
from outbox.internals import live_receivers
from outbox.models import OutboxBase
from outbox.signals import receiver_id

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
                shard_named(task.shard),
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
        events.stuck(self.model, count, self.using)

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
        settlement = merged.settlement(done)
        try:
            settled = retrying(
                self.backend, lambda: self.backend.settle(self.model, lease, settlement)
            )
        finally:
            keeper = LeaseKeeper.get()
            for task, _ in landed:
                keeper.drop(self._holdings.pop(task))
        merged.lost.update(settled.lost)
        events.leases_lost(self.model, merged.lost, self.using)
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
