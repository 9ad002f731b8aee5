"""The drain engine: claim shards with a lease, deliver their groups, settle in batches.

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
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

from django.db import connections, router

import outbox.engine.delivery as delivery
import outbox.engine.events as events
from outbox.backends import get_backend
from outbox.backends.base import Group, Lease, Settlement, ShardFilter, Window
from outbox.conf import outbox_settings
from outbox.engine.collector import collector_paused
from outbox.engine.failures import judge
from outbox.engine.keeper import Holding, LeaseKeeper
from outbox.engine.rounds import cut_at_bounds, retrying, shard_budget
from outbox.engine.stats import DrainStats, Round
from outbox.exceptions import DrainInTransaction
from outbox.models import OutboxBase
from outbox.shards import ShardKey

logger = logging.getLogger("outbox.engine")


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
    ) -> None:
        self.model = model
        self.using = using or router.db_for_write(model)
        self.backend = get_backend(self.using)
        self.scopes = scopes
        self.identifiers = identifiers
        self.stop = stop or threading.Event()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"[:128]
        self._cursor: ShardKey | None = None
        self._dispatch = delivery.Dispatch(model, self.using)
        self._report_processed = False

    def drain(self, *, deadline: float | None = None) -> DrainStats:
        """Deliver everything due now (and what becomes due meanwhile) until none is left."""
        self._refuse_open_transaction()
        stats = DrainStats()
        started = time.monotonic()
        idle_rounds = 0
        limit = outbox_settings.BATCH_SHARDS
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            lease = self._claim(self._new_lease(), limit)
            if not lease.shards:
                break
            batch = self._work(lease, bounds=None)
            stats.add(batch)
            limit = shard_budget(self.backend.wide_batches, batch)
            # A batch whose shards all came back empty (drained by someone else a moment
            # ago) is no progress; never spin on those.
            progressed = (
                batch.receiver_calls or batch.rows_retired or batch.failures or batch.dead_lettered
            )
            idle_rounds = 0 if progressed else idle_rounds + 1
            if idle_rounds >= 3:
                break
        stats.seconds = time.monotonic() - started
        return stats

    def drain_shards(self, shards: Sequence[ShardKey]) -> DrainStats:
        """Drain these shards completely, where they are due and nobody holds them.

        For schedulers that hand out shards (fan-out); a held shard is skipped.
        """
        return self.flush(dict.fromkeys(shards))

    def flush(self, bounds: Mapping[ShardKey, int | None]) -> DrainStats:
        """Deliver the due rows of these shards up to their bounds, if no one holds them.

        A shard someone else holds is left to its holder or the drain.
        """
        self._refuse_open_transaction()
        started = time.monotonic()
        lease = self._new_lease()
        window = self._claim_and_read(lease, tuple(bounds))
        if window is None:
            self._claim(lease, len(bounds), shards=tuple(bounds))
        stats = self._work(lease, bounds=bounds, window=window)
        stats.seconds = time.monotonic() - started
        return stats

    def reserve(self, limit: int, holder: str) -> Lease:
        """Claim up to `limit` due, free shards under a new lease held by `holder`, for a
        scheduler to hand out; committed on return. The caller passes `lease.token` and
        `lease.shards` on, and the worker that drains them calls `unreserve` first."""
        self._refuse_open_transaction()
        return self._claim(Lease(uuid.uuid4().hex, holder, outbox_settings.LEASE_SECONDS), limit)

    def unreserve(self, token: str, shards: Sequence[ShardKey]) -> None:
        """Release `shards` where the reservation `token` still holds them."""
        lease = Lease(token, self.holder, outbox_settings.LEASE_SECONDS, list(shards))
        retrying(lambda: self.backend.release(self.model, lease, lease.shards))

    def _claim(self, lease: Lease, limit: int, shards: tuple[ShardKey, ...] | None = None) -> Lease:
        """Claim up to `limit` shards (of `shards`, if given) passing this drainer's
        filters; the next claim resumes after the last shard won."""
        where = ShardFilter(
            shards=shards,
            scopes=tuple(self.scopes) if self.scopes else None,
            identifiers=tuple(self.identifiers) if self.identifiers else None,
            after=self._cursor if shards is None else None,
        )
        started = time.monotonic()
        retrying(lambda: self.backend.claim(self.model, lease, where, limit))
        events.claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
        if shards is None and lease.shards:
            self._cursor = lease.shards[-1]
        return lease

    def _claim_and_read(self, lease: Lease, shards: tuple[ShardKey, ...]) -> Window | None:
        """Claim `shards` and read the won ones in one step where the backend can (and
        no scope or identifier filter applies); None: claim, then read."""
        if self.scopes or self.identifiers:
            return None
        started = time.monotonic()  # the claim's duration includes its read here
        try:
            window = retrying(
                lambda: self.backend.claim_and_read(self.model, lease, shards, self._window_rows())
            )
        except BaseException:
            self._release_remaining(lease)  # won, then failed reading: let them go now
            raise
        if window is not None:
            events.claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
        return window

    def _refuse_open_transaction(self) -> None:
        if connections[self.using].in_atomic_block:
            raise DrainInTransaction(
                f"Refusing to drain {self.model._meta.label} inside an open transaction on "
                f"{self.using!r}: leases must commit on their own. Drain after commit."
            )

    def _new_lease(self) -> Lease:
        return Lease(uuid.uuid4().hex, self.holder, outbox_settings.LEASE_SECONDS)

    def _work(
        self,
        lease: Lease,
        bounds: Mapping[ShardKey, int | None] | None,
        window: Window | None = None,
    ) -> DrainStats:
        """Deliver the claimed shards window by window (the first one may be read with
        the claim already); release each once it is done."""
        stats = DrainStats(shards=len(lease.shards))
        if not lease.shards:
            return stats
        holding = Holding(self.backend, self.model, lease)
        keeper = LeaseKeeper.get()
        keeper.hold(holding)
        active = list(lease.shards)
        try:
            while active and not self.stop.is_set():
                if window is None:
                    with collector_paused():
                        window = self.backend.read_window(self.model, active, self._window_rows())
                reached = cut_at_bounds(window, bounds) if bounds else set()
                round_ = Round()
                try:
                    self._deliver(window, holding, round_)
                finally:
                    failed = {failure.shard for failure in round_.failures}
                    done = [
                        key
                        for key in active
                        if (key not in window.incomplete or key in reached) and key not in failed
                    ]
                    self._settle(lease, round_, done, stats)
                finished = {*done, *failed, *round_.lost}
                active = [key for key in active if key not in finished]
                lease.shards = [key for key in lease.shards if key not in finished]
                window = None
        finally:
            keeper.drop(holding)
            self._release_remaining(lease)
        return stats

    def _window_rows(self) -> int:
        return outbox_settings.BATCH_ROWS

    def _release_remaining(self, lease: Lease) -> None:
        if not lease.shards:
            return
        try:
            retrying(lambda: self.backend.release(self.model, lease, lease.shards))
            lease.shards = []
        except Exception:
            # The leases expire by themselves; the error that brought us here matters more.
            logger.warning("outbox could not release leases %s", lease.token, exc_info=True)

    def _deliver(self, window: Window, holding: Holding, round_: Round) -> None:
        # Receivers and lifecycle listeners are looked up once per window.
        self._report_processed = events.wants_processed(self.model)
        self._dispatch = delivery.Dispatch(self.model, self.using, timed=self._report_processed)
        stop, overdue_after = self.stop, holding.lease.seconds / 2  # see Holding
        for shard, groups in window.shards.items():
            for group in groups:
                if stop.is_set():
                    return
                if time.monotonic() - holding.renewed_at >= overdue_after:  # checked inline:
                    self._confirm_lease(holding)  # once per message, on the hot path
                if shard in holding.lost:
                    round_.lost.add(shard)
                    break
                if group.message is None:
                    break  # removed by an operator meanwhile; the next read sees the rest
                if not self._deliver_group(group, holding, round_):
                    break

    def _confirm_lease(self, holding: Holding) -> None:
        """Before the next receiver call: if the lease may have lapsed since its last
        renewal (a receiver ran past the deadline, so the keeper stopped renewing it, or
        the keeper fell behind), renew it here first. Shards another worker took
        meanwhile are lost: their rows, read before, may be delivered and gone already."""
        if not holding.renewal_overdue(time.monotonic()):
            return
        held = retrying(lambda: self.backend.renew(self.model, holding.lease))
        holding.renewed_at = time.monotonic()
        holding.lost.update(key for key in holding.lease.shards if key not in held)

    def _deliver_group(self, group: Group, holding: Holding, round_: Round) -> bool:
        """Deliver one group; False when its shard must stop here."""
        lease = holding.lease
        started = holding.receiver_started = time.monotonic()
        try:
            retired_inline = self._dispatch.send(
                group, lambda: not self._retire_now(lease, {group.shard: group.row_ids}, round_)
            )
        except delivery.LeaseLost:
            round_.receiver_calls += 1
            round_.lost.add(group.shard)
            return False
        except Exception as exc:
            round_.receiver_calls += isinstance(exc, delivery.DeliveryFailed)
            return self._failed(group, exc, round_)
        finally:
            holding.receiver_started = None
        round_.receiver_calls += 1
        round_.groups_delivered += 1
        if not retired_inline:
            round_.delivered.setdefault(group.shard, []).extend(group.row_ids)
        if self._report_processed:
            timings = dict(self._dispatch.timings or ())
            duration = time.monotonic() - started
            events.send_processed(self.model, group, duration, self.using, timings)
        return True

    def _failed(self, group: Group, exc: Exception, round_: Round) -> bool:
        """Record a failed group; True when its shard goes on (the group is dead)."""
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

    def _settle(self, lease: Lease, round_: Round, done: list[ShardKey], stats: DrainStats) -> None:
        settlement = Settlement(
            delivered=round_.delivered, failed=round_.failures, release=done, dead=round_.dead
        )
        settled = retrying(lambda: self.backend.settle(self.model, lease, settlement))
        round_.lost.update(settled.lost)
        events.leases_lost(self.model, round_.lost, self.using)
        round_.add_to(stats, settled.deleted)
