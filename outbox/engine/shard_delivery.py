"""Delivering one shard's groups in order, one call at a time, into a round.

A shard stops at its first failing group, so its later groups keep waiting in order; a
group given up as a dead letter is recorded and its shard goes on. Before each call the
lease is confirmed if its renewal is overdue, and a shard whose lease was lost stops.

A shard whose groups go only to `async def` receivers (none transactional) can instead
be delivered by a coroutine on the drain's event loop (`deliver_on_loop`): many such
shards then wait on the network at once without a thread each (`outbox.engine.window_run`
starts them). Their receivers are cancelled at `OUTBOX_RECEIVER_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import partial

import outbox.engine.events as events
import outbox.engine.receivers as receivers
from outbox.backends.base import Group, Lease, OutboxBackend, Settlement
from outbox.engine.eventloop import in_sync_thread
from outbox.engine.failures import judge
from outbox.engine.leases import Holding, retrying
from outbox.engine.rounds import Round
from outbox.engine.shard_tasks import ShardTask
from outbox.internals import has_async_receivers
from outbox.models import OutboxBase
from outbox.shards import ShardKey


class ShardDeliverer:
    """Delivers shards of one window under its lease (`holding`), with the receivers
    looked up once for the window. One per thread: `calls` records its timings."""

    def __init__(
        self,
        model: type[OutboxBase],
        using: str,
        backend: OutboxBackend,
        stop: threading.Event,
        holding: Holding,
        *,
        report_processed: bool,
    ) -> None:
        self.model = model
        self.using = using
        self.backend = backend
        self.stop = stop
        self.holding = holding
        self.report_processed = report_processed
        self.calls = receivers.ReceiverCalls(model, using, timed=report_processed)
        self._awaitable: dict[int, bool] = {}  # by category, for this window
        # The group `_deliver_group` sends now, and its round: what `_retire_sending`
        # retires (a bound method made once: the hot path makes no closure per call).
        self._sending_group: Group | None = None
        self._sending_round: Round | None = None
        self._retire = self._retire_sending
        # No async receiver at all (the usual case): no shard is ever awaitable.
        self.any_async = has_async_receivers(model.process_signal)

    def deliver(
        self, shard: ShardKey, groups: list[Group], round_: Round, call: Holding | ShardTask
    ) -> bool:
        """Deliver one shard's groups (see `deliver_each`)."""
        return self.deliver_each(((shard, groups),), round_, call)

    def deliver_each(
        self,
        shards: Iterable[tuple[ShardKey, list[Group]]],
        round_: Round,
        call: Holding | ShardTask,
    ) -> bool:
        """Deliver each shard's groups in order until one fails, shard after shard; False
        when stopping. `call` records the call running now (for the keeper, or the
        slots). One loop over a window's shards: with one message per shard, a call per
        shard would cost as much as the message."""
        # The hot path of receivers that return at once: the lease check and `_may_call`
        # inlined.
        stop, holding = self.stop, self.holding
        overdue_after = holding.lease.seconds / 2  # see Holding
        for shard, groups in shards:
            for group in groups:
                if stop.is_set():
                    return False
                if time.monotonic() - holding.renewed_at >= overdue_after:
                    self._confirm_lease(holding)
                if shard in holding.lost:
                    round_.lost.add(shard)
                    break
                if group.message is None:
                    break  # removed by an operator meanwhile; the next read sees the rest
                if not self._deliver_group(group, round_, call):
                    break
        return True

    def awaitable(self, groups: list[Group]) -> bool:
        """Every group's receivers are `async def` only: `deliver_on_loop` can take it."""
        known = self._awaitable
        for group in groups:
            category = group.category
            answer = known.get(category)
            if answer is None:
                answer = known[category] = self.calls.awaitable(category)
            if not answer:
                return False
        return True

    async def deliver_on_loop(self, task: ShardTask) -> None:
        """`deliver` of an `awaitable` shard, as a coroutine on the drain's event loop;
        what may touch the database or call other code (the lease check, a failure,
        lifecycle signals) runs on the loop's sync thread."""
        calls = self.calls.sibling()  # its own timings, beside other coroutines
        shard, round_, stop, holding = task.shard, task.round, self.stop, self.holding
        for group in task.groups:
            if stop.is_set():
                return
            if holding.renewal_overdue(time.monotonic()):
                await in_sync_thread(partial(self._confirm_lease, holding))
            if not self._may_call(shard, group, round_):
                return
            started = task.begin_call(group)
            error: Exception | None = None
            try:
                await calls.asend(group)
            except Exception as exc:
                error = exc
            finally:
                task.end_call()
            if error is None:
                if self.report_processed:
                    await in_sync_thread(partial(self._processed, group, started, calls))
                self._delivered(group, round_)
            elif not await in_sync_thread(partial(self._failed_call, group, error, round_)):
                return

    def _may_call(self, shard: ShardKey, group: Group, round_: Round) -> bool:
        """Whether the shard may go on to `group`: its lease held (as last confirmed),
        the row still there."""
        if shard in self.holding.lost:
            round_.lost.add(shard)
            return False
        return group.message is not None  # None: removed by an operator meanwhile

    def _confirm_lease(self, holding: Holding) -> None:
        """Before the next receiver call: if the lease may have lapsed since its last
        renewal (a receiver ran past the deadline, so the keeper stopped renewing it, or
        the keeper fell behind), renew it here first. Shards another worker took
        meanwhile are lost: their rows, read before, may be delivered and gone already."""
        if not holding.renewal_overdue(time.monotonic()):
            return
        held = retrying(self.backend, lambda: self.backend.renew(self.model, holding.lease))
        holding.renewed_at = time.monotonic()
        holding.lost.update(key for key in holding.lease.shards if key not in held)

    def _deliver_group(self, group: Group, round_: Round, call: Holding | ShardTask) -> bool:
        """Deliver one group; False when its shard must stop here."""
        started = call.begin_call(group)
        self._sending_group, self._sending_round = group, round_
        error: Exception | None = None
        try:
            retired_inline = self.calls.send(group, self._retire)
        except Exception as exc:
            error = exc
        finally:
            call.end_call()  # before the round changes: see ShardTask.end_call
        if error is not None:
            return self._failed_call(group, error, round_)
        # `_delivered`, inlined on the hot path (a transactional delivery retired its rows).
        round_.receiver_calls += 1
        round_.groups_delivered += 1
        if not retired_inline:
            round_.delivered.setdefault(group.shard, []).extend(group.row_ids)
        if self.report_processed:
            self._processed(group, started, self.calls)
        return True

    def _retire_sending(self) -> bool:
        """Retire the group being sent inside its transactional receivers' transaction;
        False when its lease was lost."""
        group, round_ = self._sending_group, self._sending_round
        assert group is not None and round_ is not None
        return not self._retire_now(self.holding.lease, {group.shard: group.row_ids}, round_)

    @staticmethod
    def _delivered(group: Group, round_: Round) -> None:
        round_.receiver_calls += 1
        round_.groups_delivered += 1
        round_.delivered.setdefault(group.shard, []).extend(group.row_ids)

    def _processed(self, group: Group, started: float, calls: receivers.ReceiverCalls) -> None:
        timings = dict(calls.timings or ())
        duration = time.monotonic() - started
        events.send_processed(self.model, group, duration, self.using, timings)

    def _failed_call(self, group: Group, exc: Exception, round_: Round) -> bool:
        """Record a call that raised; True when its shard goes on (the group is dead)."""
        if isinstance(exc, receivers.LeaseLost):
            round_.receiver_calls += 1
            round_.lost.add(group.shard)
            return False
        round_.receiver_calls += isinstance(exc, receivers.DeliveryFailed)
        failed, dead = judge(self.model, group, exc, self.using)
        (round_.dead if dead else round_.failures).append(failed)
        return dead

    def _retire_now(
        self, lease: Lease, row_ids: dict[ShardKey, list[int]], round_: Round
    ) -> set[ShardKey]:
        """Delete a group's rows inside its transactional receiver's transaction."""
        settled = self.backend.settle(self.model, lease, Settlement(delivered=row_ids))
        if not settled.lost:
            round_.retired_inline += settled.deleted
        return set(settled.lost)
