"""One outbox table's drain on one database (`Drainer`): claim shards with a lease,
deliver their groups, settle in batches.

A batch is: claim due shards (committed), read a window of their rows, call receivers
outside any transaction, then settle the round (delete the delivered rows, reschedule
the failed ones, release finished shards) in one statement on the fast path, guarded by
the lease. A shard stops at its first failing group, so its later groups keep waiting
in order; a group given up as a dead letter is kept aside and its shard goes on. A shard
also stops at its first row that is not due yet (the backend cuts its read there). Every
database operation goes through the backend (`outbox.backends.base`).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from django.db import connections, router

from outbox.backends import get_backend
from outbox.backends.base import Lease
from outbox.conf import outbox_settings
from outbox.engine.batch import BatchWorker
from outbox.engine.claims import Claims
from outbox.engine.leases import retrying
from outbox.engine.pace import Pace, rows_per_shard, shard_budget
from outbox.engine.pipeline import ClaimAhead, Claimed, SettleBehind, Unsettled
from outbox.engine.rounds import DrainStats
from outbox.engine.slots import SlotPool
from outbox.engine.stragglers import KeptStragglers, Stragglers, on_slots
from outbox.exceptions import DrainInTransaction
from outbox.models import OutboxBase
from outbox.shards import ShardKey

logger = logging.getLogger("outbox.engine")

# Through a backlog, how many batches are claimed ahead of the one being delivered: two
# keep the claiming thread busy while the drain reads and delivers.
CLAIMS_AHEAD = 2


class Drainer:
    """Drains one outbox table on one database. Cheap to create; not thread-safe."""

    def __init__(
        self,
        model: type[OutboxBase],
        using: str | None = None,
        *,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
        stop: threading.Event | None = None,
        concurrency: int | None = None,
        slots: SlotPool | None = None,
        stragglers: KeptStragglers | None = None,
    ) -> None:
        self.model = model
        self.using = using or router.db_for_write(model)
        self.backend = get_backend(self.using)
        self.scopes = scopes
        self.identifiers = identifiers
        self.stop = stop or threading.Event()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"[:128]
        self.concurrency = concurrency  # None: OUTBOX_CONCURRENCY
        self._kept_slots = slots  # a pool kept by the caller across drains, else None
        # A loop's stragglers, kept across its drains on `slots`: a drain does not wait
        # for them (else None: it waits for its own before it returns).
        self._kept_stragglers = stragglers
        self._stragglers: Stragglers | None = None  # while delivering on slots
        self._batch = BatchWorker(self.model, self.using, self.backend, self.stop)
        self._claims = Claims(self._batch, self.holder, scopes, identifiers)
        self._pace = Pace()
        self._claimed_again = False
        self._woken = False  # looked at the backing-off shards in this drain

    def drain(self, *, deadline: float | None = None) -> DrainStats:
        """Deliver everything due now (and what becomes due meanwhile) until none is left."""
        self._refuse_open_transaction()
        stats = DrainStats()
        started = time.monotonic()
        self._woken = False
        behind = None
        if outbox_settings.SETTLE_IN_BACKGROUND and self.backend.settles_behind:
            behind = SettleBehind(self.backend, self.model, self.using)
        with self._delivering_on_slots(stats):
            self._batches(stats, deadline, behind)
        stats.seconds = time.monotonic() - started
        return stats

    @contextmanager
    def _delivering_on_slots(self, stats: DrainStats) -> Iterator[None]:
        """Inside, deliver on slot threads where the concurrency asks for them."""
        size, kept = self._slot_count, self._kept_slots
        with on_slots(
            self.backend, self.model, self.using, size, kept, stats, self._kept_stragglers
        ) as pair:
            batch = self._batch
            batch.slots, batch.stragglers = pair or (None, None)
            self._stragglers = batch.stragglers
            try:
                yield
            finally:
                batch.slots = batch.stragglers = self._stragglers = None

    def _batches(
        self, stats: DrainStats, deadline: float | None, behind: SettleBehind | None
    ) -> None:
        """Claim and work batches until none is due. From the second full batch in a row
        on (a backlog), the settle of each one is left to `behind`, done while the next
        one runs, and the next two are claimed while this one is read and delivered
        (`outbox.engine.pipeline`)."""
        idle_rounds = full_in_a_row = 0
        limit = self._pace.limit(outbox_settings.BATCH_SHARDS, self._slot_count)
        pending: Unsettled | None = None  # the last batch, delivered, not settled yet
        ahead = ClaimAhead(self.backend, self.model)  # no thread until it starts
        try:
            while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
                if behind is not None and behind.busy and not full_in_a_row:
                    behind.wait(stats)  # the backlog looks done: release its last shards
                claimed = self._next_claim(ahead, limit, stats)
                lease = claimed.lease
                if not lease.shards and behind is not None and (pending or behind.busy):
                    # Shards still being settled were leased to that claim: settle
                    # them, then look again (rows may have come meanwhile).
                    last, pending = pending, None
                    behind.catch_up(stats, last)
                    continue
                if pending is not None and behind is not None:
                    self._settle_behind(behind, pending, stats, claimed, ahead)
                    pending = None
                if not lease.shards:
                    if self._claim_again(stats):
                        continue
                    break
                full_in_a_row = full_in_a_row + 1 if len(lease.shards) >= limit else 0
                defer = behind is not None and full_in_a_row >= 2
                while defer and ahead.started < CLAIMS_AHEAD:
                    ahead.start(self._claimer(limit))
                batch, pending = self._work_paced(claimed, defer)
                stats.add(batch)
                limit = self._next_limit(batch, full=full_in_a_row > 0)
                # A batch whose shards all came back empty (drained by someone else a
                # moment ago) is no progress; never spin on those.
                idle_rounds = 0 if batch.progressed else idle_rounds + 1
                if idle_rounds >= 3:
                    break
        except BaseException:
            ahead.close()
            if behind is not None:
                behind.abandon(pending)  # what it cannot settle is logged
            raise
        ahead.close()  # a batch claimed ahead of a stop or a deadline is let go
        if behind is not None:
            behind.close(stats, pending)

    def _claim_again(self, stats: DrainStats) -> bool:
        """The due shards ran out: whether to claim again. Yes when stragglers landed
        meanwhile (their shards may have been written to since): a one-shot drain waits
        a little for one while any runs; a loop's drain does not wait, its next round
        comes when a straggler lands or a write is told. And, once per drain, yes when
        backing-off shards that a new message reached were woken for one early attempt:
        looked for here, not before the first claim, which a fresh message waits for."""
        if self._stragglers is not None:
            if self._kept_stragglers is not None:
                if self._stragglers.settle(stats):
                    return True
            elif self._stragglers.waited(stats):
                return True
        if self._woken:
            return False
        self._woken = True
        return bool(self._claims.wake())

    @property
    def _slot_count(self) -> int:
        if self._kept_slots is not None:
            return self._kept_slots.size
        return self.concurrency or outbox_settings.CONCURRENCY

    def _work_paced(self, claimed: Claimed, defer: bool) -> tuple[DrainStats, Unsettled | None]:
        """Work a claimed batch (`_work`), noting how long it took per shard."""
        started = time.monotonic()
        batch, pending = self._batch.work(claimed.lease, None, defer=defer, holding=claimed.holding)
        self._pace.observe(batch, time.monotonic() - started, self._batch.mean_call_seconds)
        return batch, pending

    def _next_claim(self, ahead: ClaimAhead, limit: int, stats: DrainStats) -> Claimed:
        """The batch claimed ahead, if any, else a claim now (first settling the
        stragglers that landed). A claim made ahead that won nothing may predate a
        settle that let shards go with rows written to them meanwhile: the drain never
        ends on it, but claims again."""
        if self._stragglers is not None:
            self._stragglers.settle(stats)
        if ahead.started:
            claimed = ahead.take()
            if claimed.lease.shards:
                return claimed
            ahead.cancel()
        lease = self._claims.claim(self._claims.new_lease(), limit)
        if not lease.shards and not stats.shards and not self._claimed_again:
            # A drain's first claim can lose every shard to one started at the same
            # moment (their claims walked the same shards); the winner's leases are
            # committed now, so one more look finds the shards it left.
            self._claimed_again = True
            time.sleep(random.uniform(0.001, 0.005))
            lease = self._claims.claim(self._claims.new_lease(), limit)
        return Claimed(lease)

    def _next_limit(self, batch: DrainStats, *, full: bool) -> int:
        """How many shards the next claim takes, after `batch`; and whether they are
        likely small: `batch` was full (a backlog) and its shards held a row or two
        each (a backend may then look for them differently)."""
        self._claims.small = full and 0 < rows_per_shard(batch) <= 1.5
        budget = shard_budget(self.backend.wide_batches, batch)
        return self._pace.limit(budget, self._slot_count)

    def _claimer(self, limit: int) -> Callable[[], Lease]:
        """The next claim, to run ahead on another thread."""
        return lambda: self._claims.claim(self._claims.new_lease(), limit)

    def _settle_behind(
        self,
        behind: SettleBehind,
        pending: Unsettled,
        stats: DrainStats,
        claimed: Claimed,
        ahead: ClaimAhead,
    ) -> None:
        """Hand `pending` to `behind`, to settle while `claimed` runs; if that fails,
        `claimed` is let go (never worked)."""
        try:
            behind.submit(pending, stats)
        except BaseException:
            ahead.release(claimed)
            raise

    def drain_shards(self, shards: Sequence[ShardKey]) -> DrainStats:
        """Drain these shards completely, where they are due and nobody holds them.

        For schedulers that hand out shards (fan-out); a held shard is skipped.
        """
        stats = DrainStats()
        with self._delivering_on_slots(stats):
            stats.add(self.flush(dict.fromkeys(shards)))
        return stats

    def flush(self, bounds: Mapping[ShardKey, int | None], *, wake: bool = True) -> DrainStats:
        """Deliver the due rows of these shards up to their bounds, if no one holds them.

        A shard someone else holds is left to its holder or the drain. A shard backing
        off after a failure, which these rows reached since, is woken for one early
        attempt (`wake`), then flushed.
        """
        self._refuse_open_transaction()
        started = time.monotonic()
        lease = self._claims.new_lease()
        window = self._claims.claim_and_read(lease, tuple(bounds))
        if window is None:
            self._claims.claim(lease, len(bounds), shards=tuple(bounds))
        won = set(lease.shards)
        stats, _ = self._batch.work(lease, bounds=bounds, window=window)
        missed = tuple(key for key in bounds if key not in won)
        if wake and missed and (woken := self._claims.wake(missed)):
            stats.add(self.flush({key: bounds[key] for key in woken}, wake=False))
        stats.seconds = time.monotonic() - started
        return stats

    def reserve(self, limit: int, holder: str) -> Lease:
        """Claim up to `limit` due, free shards under a new lease held by `holder`, for a
        scheduler to hand out; committed on return. The caller passes `lease.token` and
        `lease.shards` on, and the worker that drains them calls `unreserve` first."""
        self._refuse_open_transaction()
        lease = Lease(uuid.uuid4().hex, holder, outbox_settings.LEASE_SECONDS)
        return self._claims.claim(lease, limit)

    def unreserve(self, token: str, shards: Sequence[ShardKey]) -> None:
        """Release `shards` where the reservation `token` still holds them."""
        lease = Lease(token, self.holder, outbox_settings.LEASE_SECONDS, list(shards))
        retrying(self.backend, lambda: self.backend.release(self.model, lease, lease.shards))

    def _refuse_open_transaction(self) -> None:
        if connections[self.using].in_atomic_block:
            raise DrainInTransaction.refusing(self.model._meta.label, self.using)
