"""One outbox table's drain: claim due shards with a lease, read them window by window,
deliver, settle; `drain_outboxes()`, one drain of every table; and `flush_shards()`, the
synchronous flush after a commit. Each part below needs
only the parts above it.

How many shards to claim
------------------------
How many shards a drain claims at once: about what it delivers in a moment.

Two reasons to keep a batch short in time. Shards a worker has claimed wait for it,
however slow its receivers are, while other workers find nothing to claim. And rows a
worker has delivered are deleted when their round is settled: if the worker dies first,
they are delivered again. Through a backlog a worker has two rounds unsettled at most
(the one it delivers, and the one settling behind it), so each is kept to half of
`OUTBOX_UNSETTLED_SECONDS` when receivers wait (calls of `WAITING_CALL_SECONDS` or more):
a drain claims the shards its slots deliver in that time, judged by its last batch, in
whole rounds of its slots, within the row-count budget (`OUTBOX_BATCH_SHARDS`,
`OUTBOX_BATCH_ROWS`) and never fewer than one shard per slot. Receivers that return at
once fill the budget long before, so for them a batch may take up to
`FAST_BATCH_SECONDS`, and the statements per message stay what they were. Windows are
not shortened: a group is delivered with the newest row its window read, so a window
cut short would deliver a group twice in one pass. A first claim, before the drain has
seen a receiver, is small (`FIRST_CLAIM_PER_SLOT` shards per slot, at least
`FIRST_CLAIM_LEAST`): fast receivers lose a round trip or two to it, slow ones leave the
rest of the shards to other drains started at the same moment, which would otherwise
find every shard taken and end (the bench's "Receivers that wait" section measures it).

Working one claimed batch
-------------------------
Working one leased batch: read its shards window by window, call the receivers of
each group, settle each round (or hand the last one back to be settled behind).

`BatchWorker` does what a drain does with a batch it has claimed; `Drainer`
(below) claims the batches and decides when each is worked on.

Taking shards
-------------
How a drainer takes shards of its table: claims through the backend under the
drainer's filters, resuming after the last shard won so that every shard gets its turn,
and the early wake of backing-off shards that a new message reached.

The table's drainer
-------------------
One outbox table's drain on one database (`Drainer`): claim shards with a lease,
deliver their groups, settle in batches.

A batch is: claim due shards (committed), read a window of their rows, call receivers
outside any transaction, then settle the round (delete the delivered rows, reschedule
the failed ones, release finished shards) in one statement on the fast path, guarded by
the lease. A shard stops at its first failing group, so its later groups keep waiting
in order; a group given up as a dead letter is kept aside and its shard goes on. A shard
also stops at its first row that is not due yet (the backend cuts its read there). Every
database operation goes through the backend (`outbox.backends.base`).

Every table, once
-----------------
The engine's two calls: `drain_outboxes()`, one drain of every due shard in the
calling thread, and `flush_shards()`, the synchronous flush after a commit (which
`OutboxConfig.ready` installs in the write path, `outbox.writes.context.install`, so the
write path never imports the engine).
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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime

from django.db import connections, router

from outbox.backends import get_backend
from outbox.backends.base import HeldLeases, Lease, OutboxBackend, ShardFilter, Window
from outbox.conf import outbox_settings
from outbox.engine.delivery import SLOW_CALL_SECONDS, ShardDeliverer
from outbox.engine.pipeline import (
    ClaimAhead,
    Claimed,
    DrainStats,
    Holding,
    LeaseKeeper,
    Round,
    SettleBehind,
    Unsettled,
    collector_paused,
    cut_at_bounds,
    done_shards,
    release_quietly,
    report_claimed,
    retrying,
    settle_round,
    wants_processed,
)
from outbox.engine.slots import KeptStragglers, SlotPool, Stragglers, deliver_window, on_slots
from outbox.exceptions import DrainInTransaction
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey

# --- How many shards to claim -------------------------------------------------------

FIRST_CLAIM_PER_SLOT = 4
FIRST_CLAIM_LEAST = 16
# How long a batch of receivers that return at once may take: the bound on unsettled
# work is for receivers that wait, and fast ones fill the row budget well inside it.
FAST_BATCH_SECONDS = 1.0
# Receivers that wait: calls of a millisecond or more on average.
WAITING_CALL_SECONDS = 0.001
# A loop's round waits its gather (`OUTBOX_LOOP_GATHER_SECONDS`) only after a batch that
# retired fewer rows than this: the round's own cost (its two statements and the
# hand-offs between threads) then outweighs its messages', and the next commits are
# worth waiting for; a batch this big or more claims again at once.
GATHER_BELOW_ROWS = 16


class Pace:
    """One drain's claim size, from the time its last batch took per shard."""

    def __init__(self) -> None:
        self.seconds_per_shard: float | None = None  # wall time, slots working at once
        self.waiting = False  # the last batch's receivers waited (see the module)

    def observe(self, batch: DrainStats, seconds: float, call_seconds: float | None) -> None:
        """A batch took `seconds`, its receiver calls `call_seconds` each on average."""
        if batch.shards and batch.receiver_calls:
            self.seconds_per_shard = seconds / batch.shards
            self.waiting = call_seconds is not None and call_seconds >= WAITING_CALL_SECONDS

    def target_seconds(self) -> float:
        """How long one batch should take to deliver."""
        if self.waiting:
            return outbox_settings.UNSETTLED_SECONDS / 2
        return FAST_BATCH_SECONDS

    def limit(self, budget: int, concurrency: int) -> int:
        """How many shards the next claim takes: at most `budget`, but at least one per
        slot whatever the budget, so that every slot has a shard to deliver (with
        `async def` receivers, hundreds of calls may wait at once)."""
        budget = max(budget, concurrency)
        per_shard = self.seconds_per_shard
        if per_shard is None:
            return min(budget, max(FIRST_CLAIM_LEAST, FIRST_CLAIM_PER_SLOT * concurrency))
        fits = int(self.target_seconds() / per_shard) if per_shard > 0 else budget
        if self.waiting and fits > concurrency:
            # Whole rounds of the slots: a last round that keeps only some of them busy
            # takes as long as a full one.
            fits -= fits % concurrency
        return max(min(budget, fits), concurrency, 1)


def shard_budget(wide_batches: bool, batch: DrainStats) -> int:
    """How many shards the next batch claims: OUTBOX_BATCH_SHARDS; or, on a backend
    whose steps cost one statement each whatever the shard count (`wide_batches`), as
    many shards as fill a window of OUTBOX_BATCH_ROWS at the last batch's rows per shard
    (one message per shard: up to OUTBOX_BATCH_ROWS shards), so small shards cost no
    more round trips per message than big ones."""
    shards = outbox_settings.BATCH_SHARDS
    if not wide_batches or not batch.shards:
        return shards
    per_shard = max(rows_per_shard(batch), 1.0)
    return max(shards, min(outbox_settings.BATCH_ROWS, int(outbox_settings.BATCH_ROWS / per_shard)))


def rows_worked(batch: DrainStats) -> int:
    """The rows a batch worked on: retired, failed or dead-lettered."""
    return batch.rows_retired + batch.failures + batch.dead_lettered


def rows_per_shard(batch: DrainStats) -> float:
    """The rows a batch worked on per shard it claimed."""
    return rows_worked(batch) / batch.shards if batch.shards else 0.0


# --- Working one claimed batch ------------------------------------------------------


class BatchWorker:
    """Delivers and settles claimed batches of one outbox table on one database, for
    the `Drainer` that claimed them."""

    def __init__(
        self, model: type[OutboxBase], using: str, backend: OutboxBackend, stop: threading.Event
    ) -> None:
        self.model = model
        self.using = using
        self.backend = backend
        self.stop = stop
        # While a drain delivers on slot threads: the slots, and its stragglers.
        self.slots: SlotPool | None = None
        self.stragglers: Stragglers | None = None
        self._wide = False  # receivers wait: start every window on all slots
        # The last window's receivers returned at once: deliver the next one with the
        # collector paused (see "The collector paused" in `outbox.engine.pipeline`).
        self._fast = False
        self._report_processed = False
        # Receiver calls of the last `work`, and their time, wherever they ran.
        self._calls = 0
        self._call_seconds = 0.0

    def work(
        self,
        lease: Lease,
        bounds: Mapping[ShardKey, int | None] | None,
        window: Window | None = None,
        defer: bool = False,
        holding: Holding | None = None,
    ) -> tuple[DrainStats, Unsettled | None]:
        """Deliver the claimed shards window by window (the first one may be read with
        the claim already); release each once it is done. With `defer`, the last round
        is returned unsettled (`behind`) when nothing went wrong delivering it.
        `holding`: the lease's, where the keeper renews it already (claimed ahead)."""
        stats = DrainStats(shards=len(lease.shards))
        if not lease.shards:
            return stats, None
        holding = holding or Holding(self.backend, self.model, lease)
        self._calls, self._call_seconds = 0, 0.0
        keeper = LeaseKeeper.get()
        keeper.hold(holding)
        active = list(lease.shards)
        pending = None
        try:
            while active and not self.stop.is_set():
                if window is None:
                    window = self.read(active)
                reached = cut_at_bounds(window, bounds) if bounds else set()
                round_ = Round()
                delivered = False
                try:
                    paused, self._fast = self._fast, False  # until this window is seen through
                    calls = self._calls
                    with collector_paused() if paused else nullcontext():
                        self._deliver(window, holding, round_)
                    if self._calls == calls:
                        # It called nothing (its shards had no row left): that says
                        # nothing of the receivers, so the judgement before it stands.
                        self._fast = paused
                    delivered = defer and not round_.running
                finally:
                    done, finished = self._round_end(active, window, reached, round_)
                    if delivered and all(key in finished for key in active):
                        pending = self._defer(lease, round_, done, holding, stats)
                    else:
                        self._settle(lease, round_, done, stats)
                    # Stragglers keep leases of their own (`outbox.engine.slots`).
                    lease.shards = [key for key in lease.shards if key not in round_.running]
                if pending is not None:
                    break  # the lease keeps its shards and renewal until settled
                active = [key for key in active if key not in finished]
                lease.shards = [key for key in lease.shards if key not in finished]
                window = None
        finally:
            if pending is None:
                keeper.drop(holding)
                self.release_remaining(lease)
        return stats, pending

    @property
    def mean_call_seconds(self) -> float | None:
        """How long the last `work`'s receiver calls took on average (None: no call)."""
        return self._call_seconds / self._calls if self._calls > 0 else None

    @staticmethod
    def _round_end(
        active: list[ShardKey], window: Window, reached: set[ShardKey], round_: Round
    ) -> tuple[list[ShardKey], set[ShardKey]]:
        """The shards a round is done with (release them), and all it is through with:
        done, failed, lost, or carved out to finish on their own."""
        failed = {failure.shard for failure in round_.failures}
        settling = [key for key in active if key not in round_.running]
        done = done_shards(settling, window, reached, failed)
        return done, {*done, *failed, *round_.lost, *round_.running}

    def window_rows(self) -> int:
        return outbox_settings.BATCH_ROWS

    def read(self, shards: list[ShardKey]) -> Window:
        """The next window of `shards`; with each message's date_added where the
        engine measures its lag."""
        timed = wants_processed(self.model)
        with collector_paused():
            return self.backend.read_window(self.model, shards, self.window_rows(), timed=timed)

    def release_remaining(self, lease: Lease) -> None:
        if lease.shards and release_quietly(self.backend, self.model, lease):
            lease.shards = []

    def _deliver(self, window: Window, holding: Holding, round_: Round) -> None:
        """Deliver the window's groups into `round_`, shard after shard, or on the slots
        (`outbox.engine.slots`) during a drain with concurrency."""
        # Receivers and lifecycle listeners are looked up once per window.
        self._report_processed = wants_processed(self.model)
        if self.slots is not None:  # a lone shard too: its call may hang
            self._deliver_on_slots(self.slots, window, holding, round_)
            return
        deliverer = self._deliverer(holding)
        # The mean call is taken over the window as a whole, not timed call by call: what
        # the engine adds per call is far below what tells a waiting receiver apart.
        calls, started = round_.receiver_calls, time.monotonic()
        deliverer.deliver_each(window.shards.items(), round_, holding)
        if round_.receiver_calls > calls:
            self._count_calls(round_.receiver_calls - calls, time.monotonic() - started)

    def _count_calls(self, made: int, seconds: float) -> None:
        """A window's receiver calls and their time; whether they returned at once (and
        needed no other slot), so that the next window is delivered paused."""
        self._calls += made
        self._call_seconds += seconds
        self._fast = bool(made) and not self._wide and seconds < SLOW_CALL_SECONDS * made

    def _deliverer(self, holding: Holding) -> ShardDeliverer:
        return ShardDeliverer(
            self.model,
            self.using,
            self.backend,
            self.stop,
            holding,
            report_processed=self._report_processed,
        )

    def _deliver_on_slots(
        self, slots: SlotPool, window: Window, holding: Holding, round_: Round
    ) -> None:
        """Deliver the window's shards on the slots (`outbox.engine.slots`); shards still
        in a call when the rest are done go on as stragglers (`round_.running`)."""
        shards = list(window.shards.items())
        run = deliver_window(
            slots,
            shards,
            lambda: self._deliverer(holding),
            start_wide=self._wide,
            stopping=self.stop,
        )
        # Calls awaited on the loop need no slot: only slow calls on slots widen.
        self._wide = run.slow or any(not task.on_loop for task in run.carved)
        tasks = (*run.finished, *run.carved)
        self._count_calls(sum(t.calls for t in tasks), sum(t.call_seconds for t in tasks))
        for task in run.finished:
            round_.merge(task.round)
        for task in run.carved:
            if task.window_part is not None:
                round_.merge(task.window_part)
        if run.carved:
            assert self.stragglers is not None
            self.stragglers.adopt(run.carved, holding.lease)
            round_.running.update(task.shard for task in run.carved)
        errors = [task.error for task in run.finished if task.error is not None]
        if errors:
            raise errors[0]

    def _settle(self, lease: Lease, round_: Round, done: list[ShardKey], stats: DrainStats) -> None:
        settled = settle_round(self.backend, self.model, self.using, lease, round_, done)
        round_.add_to(stats, settled.deleted)

    def _defer(
        self, lease: Lease, round_: Round, done: list[ShardKey], holding: Holding, stats: DrainStats
    ) -> Unsettled:
        """The round, to settle later, counted now as if it deleted what it delivered."""
        settlement = round_.settlement(done)
        expected = sum(len(row_ids) for row_ids in round_.delivered.values())
        round_.add_to(stats, expected)
        return Unsettled(lease, round_, settlement, expected, holding)


# --- Taking shards ------------------------------------------------------------------


class Claims:
    """The claims of one `Drainer`: its filters, its place in the shard order, and
    whether its last batch held shards of a row or two each (`small`, a hint)."""

    def __init__(
        self,
        batch: BatchWorker,
        holder: str,
        scopes: Sequence[int] | None,
        identifiers: Sequence[int] | None,
    ) -> None:
        self.model, self.using, self.backend = batch.model, batch.using, batch.backend
        self._batch = batch
        self.holder = holder
        self.scopes = tuple(scopes) if scopes else None
        self.identifiers = tuple(identifiers) if identifiers else None
        self.cursor: ShardKey | None = None
        self.small = False

    def new_lease(self) -> Lease:
        return Lease(uuid.uuid4().hex, self.holder, outbox_settings.LEASE_SECONDS)

    def wake(self, shards: tuple[ShardKey, ...] | None = None) -> list[ShardKey]:
        """Wake the backing-off shards (of `shards`, if given) passing the filters that
        a message reached since their last failure, for one early attempt; returns them."""
        where = self._filter(shards)
        return retrying(self.backend, lambda: self.backend.wake(self.model, where))

    def claim(self, lease: Lease, limit: int, shards: tuple[ShardKey, ...] | None = None) -> Lease:
        """Claim up to `limit` shards (of `shards`, if given) passing the filters; the
        next claim resumes after the last shard won."""
        where = self._filter(shards)
        started = time.monotonic()
        retrying(self.backend, lambda: self.backend.claim(self.model, lease, where, limit))
        report_claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
        if shards is None and lease.shards:
            self.cursor = lease.shards[-1]
        return lease

    def claim_due_and_read(self, lease: Lease, limit: int) -> Window | None:
        """`claim` and the first read of the shards won in one step where the backend
        can; None: it cannot here (nothing was claimed), so claim, then read."""
        where = self._filter(None)
        started = time.monotonic()  # the claim's duration includes its read here
        rows, timed = self._batch.window_rows(), wants_processed(self.model)
        try:
            window = retrying(
                self.backend,
                lambda: self.backend.claim_due_and_read(
                    self.model, lease, where, limit, rows, timed=timed
                ),
            )
        except BaseException:
            self._batch.release_remaining(lease)  # won, then failed reading: let them go now
            raise
        if window is not None:
            report_claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
            if lease.shards:
                self.cursor = lease.shards[-1]
        return window

    def held_by_others(self) -> HeldLeases:
        """The leases other drains hold now of the shards passing the filters."""
        where, holder = self._filter(None), self.holder
        return retrying(
            self.backend, lambda: self.backend.held_by_others(self.model, where, holder)
        )

    def claim_and_read(self, lease: Lease, shards: tuple[ShardKey, ...]) -> Window | None:
        """Claim `shards` and read the won ones in one step where the backend can (and
        no scope or identifier filter applies); None: claim, then read."""
        if self.scopes or self.identifiers:
            return None
        started = time.monotonic()  # the claim's duration includes its read here
        try:
            rows = self._batch.window_rows()
            timed = wants_processed(self.model)  # the lag needs date_added
            window = retrying(
                self.backend,
                lambda: self.backend.claim_and_read(self.model, lease, shards, rows, timed=timed),
            )
        except BaseException:
            self._batch.release_remaining(lease)  # won, then failed reading: let them go now
            raise
        if window is not None:
            report_claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
        return window

    def _filter(self, shards: tuple[ShardKey, ...] | None) -> ShardFilter:
        return ShardFilter(
            shards=shards,
            scopes=self.scopes,
            identifiers=self.identifiers,
            after=self.cursor if shards is None else None,
            small=self.small and shards is None,
        )


# --- The table's drainer ------------------------------------------------------------

logger = logging.getLogger("outbox.engine")

# Through a backlog, how many batches are claimed ahead of the one being delivered: two
# keep the claiming thread busy while the drain reads and delivers.
CLAIMS_AHEAD = 2
# A drain whose claim came back empty while other drains hold shards looks again as
# long as they claim anew within this long (`Drainer._lost_a_race`).
RACE_PATIENCE_SECONDS = 0.5
# However much they claim, a drain that has won nothing for this long ends (a one-shot
# drain beside loops under steady writes would otherwise look on for ever).
RACE_GIVE_UP_SECONDS = 5.0
# The waits between those looks: from the first to the last, doubling.
RACE_LOOKS_SECONDS = (0.005, 0.05)
# A loop drains once a write or so: looking at the backing-off shards on every round
# (a query of the lease table) would cost a statement a message while writes trickle
# in, so a loop's drains look at most this often. A message reaching a backing-off
# shard then waits up to this long for its early attempt.
LOOP_WAKE_SECONDS = 1.0
# When a loop's drain last looked, per table, database and filters (`_wake_due`).
_last_looks: dict[tuple[str, str, tuple[int, ...] | None, tuple[int, ...] | None], float] = {}


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
        wait_for_others: bool = True,
        gather: float = 0.0,
    ) -> None:
        self.model = model
        # How long to wait after a batch that was not full before the next claim (a
        # loop's `OUTBOX_LOOP_GATHER_SECONDS`), so that writes arriving together meet.
        self.gather = gather
        # Whether an empty claim while other drains hold shards is looked at again
        # (`_lost_a_race`); a loop's is not: its next round comes with the next write.
        self.wait_for_others = wait_for_others
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
        # Since a claim came back empty while others held shards (None: the last claim
        # won some).
        self._race: _Race | None = None

    def drain(self, *, deadline: float | None = None) -> DrainStats:
        """Deliver everything due now (and what becomes due meanwhile) until none is left."""
        self._refuse_open_transaction()
        stats = DrainStats()
        started = time.monotonic()
        self._woken = False
        self._race = None
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
                claimed = self._next_claim(ahead, limit, stats, read_too=not full_in_a_row)
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
                self._race = None
                full_in_a_row = full_in_a_row + 1 if len(lease.shards) >= limit else 0
                defer = behind is not None and full_in_a_row >= 2
                while defer and ahead.started < CLAIMS_AHEAD:
                    ahead.start(self._claimer(limit))
                batch, pending = self._work_paced(claimed, defer)
                stats.add(batch)
                if self.gather and not full_in_a_row and batch.rows_retired < GATHER_BELOW_ROWS:
                    self.stop.wait(self.gather)  # writes trickling in: let the next ones meet
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
        looked for here, not before the first claim, which a fresh message waits for
        (by a loop's drains, at most every `LOOP_WAKE_SECONDS`: `_wake_due`)."""
        if self._stragglers is not None:
            if self._kept_stragglers is not None:
                if self._stragglers.settle(stats):
                    return True
            elif self._stragglers.waited(stats):
                return True
        if not self._woken:
            self._woken = True
            if self._wake_due() and self._claims.wake():
                return True
        return self.wait_for_others and self._lost_a_race()

    def _wake_due(self) -> bool:
        """Whether this drain looks at the backing-off shards: a one-shot drain always
        does; a loop's drain (it does not wait for others) only where no loop's drain of
        the same table and filters in this process looked in the last
        `LOOP_WAKE_SECONDS`."""
        if self.wait_for_others:
            return True
        key = (self.model._meta.label, self.using, self._claims.scopes, self._claims.identifiers)
        now = time.monotonic()
        if now - _last_looks.get(key, -LOOP_WAKE_SECONDS) < LOOP_WAKE_SECONDS:
            return False
        _last_looks[key] = now
        return True

    def _lost_a_race(self) -> bool:
        """The claim came back empty while other drains hold shards of the table: a
        claim race lost, not a backlog done, as long as they go on claiming (their
        batches end and let shards go with rows left, or they would claim no more).
        Look again a moment later, while their latest claim moves within
        `RACE_PATIENCE_SECONDS`; drains held up only by calls that do not return (the
        same leases, no new claim) are left to it, and the drain ends, as it does once it
        has won nothing for `RACE_GIVE_UP_SECONDS`."""
        held = self._claims.held_by_others()
        if not held.count:
            # Racing, the others let go between our claim and this look: one more claim
            # finds what they left (and ends the drain if it finds nothing).
            if self._race is not None and not self._race.last_claim:
                self._race.last_claim = True
                return True
            return False
        now = time.monotonic()
        race = self._race
        if race is None:
            race = self._race = _Race(held.latest, moved_at=now, since=now)
        elif held.latest != race.latest:
            race.latest, race.moved_at = held.latest, now
        elif now - race.moved_at >= RACE_PATIENCE_SECONDS:
            return False
        if now - race.since >= RACE_GIVE_UP_SECONDS:
            return False
        first, last = RACE_LOOKS_SECONDS
        self.stop.wait(min(first * 2**race.looks, last))
        race.looks += 1
        return True

    @property
    def _slot_count(self) -> int:
        if self._kept_slots is not None:
            return self._kept_slots.size
        return self.concurrency or outbox_settings.CONCURRENCY

    def _work_paced(self, claimed: Claimed, defer: bool) -> tuple[DrainStats, Unsettled | None]:
        """Work a claimed batch (`_work`), noting how long it took per shard."""
        started = time.monotonic()
        batch, pending = self._batch.work(
            claimed.lease, None, claimed.window, defer=defer, holding=claimed.holding
        )
        self._pace.observe(batch, time.monotonic() - started, self._batch.mean_call_seconds)
        return batch, pending

    def _next_claim(
        self, ahead: ClaimAhead, limit: int, stats: DrainStats, *, read_too: bool = False
    ) -> Claimed:
        """The batch claimed ahead, if any, else a claim now (first settling the
        stragglers that landed); with `read_too` (no backlog: the last batch was not
        full), its first window read by the claim's own statement where the backend
        can. A claim made ahead that won nothing may predate a settle that let shards
        go with rows written to them meanwhile: the drain never ends on it, but claims
        again."""
        if self._stragglers is not None:
            self._stragglers.settle(stats)
        if ahead.started:
            claimed = ahead.take()
            if claimed.lease.shards:
                return claimed
            ahead.cancel()
        lease = self._claims.new_lease()
        window = self._claims.claim_due_and_read(lease, limit) if read_too else None
        if window is None:
            self._claims.claim(lease, limit)
        elif lease.shards:
            return Claimed(lease, window=window)
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


@dataclass
class _Race:
    """A drain's empty claims while other drains held shards (`Drainer._lost_a_race`)."""

    latest: datetime | None  # the others' latest claim, as last seen
    moved_at: float  # when it was seen to move (or first seen)
    since: float  # the first of these empty claims
    looks: int = 0
    last_claim: bool = False  # the others held nothing at the last look: claimed once more


# --- Every table, once --------------------------------------------------------------


def drain_outboxes(
    models: Sequence[type[OutboxBase]] | None = None,
    *,
    using: str | None = None,
    scopes: Sequence[int] | None = None,
    identifiers: Sequence[int] | None = None,
    deadline: float | None = None,
    stop: threading.Event | None = None,
    concurrency: int | None = None,
    slots: SlotPool | None = None,
    stragglers: KeptStragglers | None = None,
    wait_for_others: bool = True,
    gather: float = 0.0,
) -> DrainStats:
    """Drain every due shard of the given tables (all of them by default) once, in the
    calling thread: no signals, no graceful timeout (a backlog's settles may run on a
    helper thread meanwhile; all are done on return). `concurrency`: how many shards
    are delivered at once (default `OUTBOX_CONCURRENCY`); `slots`: a pool of slot
    threads the caller keeps across drains instead (`DrainWorker` does), and `stragglers`
    the calls it lets run on them past a drain (not waited for here).
    `wait_for_others`: when a claim comes back empty while other drains hold shards of
    the table and go on claiming, look again rather than end (a claim race lost, not a
    backlog done); a loop's rounds pass False, as the next write starts another round.
    `gather`: how long to wait after a batch that was not full, and retired fewer than
    `GATHER_BELOW_ROWS` rows, before claiming again (a loop's rounds pass
    `OUTBOX_LOOP_GATHER_SECONDS`)."""
    stats = DrainStats()
    for model in models or outbox_models():
        drainer = Drainer(
            model,
            using,
            scopes=scopes,
            identifiers=identifiers,
            stop=stop,
            concurrency=concurrency,
            slots=slots,
            stragglers=stragglers,
            wait_for_others=wait_for_others,
            gather=gather,
        )
        result = drainer.drain(deadline=deadline)
        stats.add(result)
        stats.seconds += result.seconds
    return stats


def flush_shards(
    using: str, bounds: Mapping[type[OutboxBase], Mapping[ShardKey, int | None]]
) -> DrainStats:
    """The synchronous flush after a commit (the write path's flush hook): deliver the
    written shards up to their bounds (the highest row id the transaction wrote per
    shard; None: no bound). A shard another worker holds is left to it."""
    stats = DrainStats()
    for model, shard_bounds in bounds.items():
        result = Drainer(model, using).flush(shard_bounds)
        stats.add(result)
        stats.seconds += result.seconds
    return stats
