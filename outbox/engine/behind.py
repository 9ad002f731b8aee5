"""Settling a delivered batch on a thread of its own while the drain works on the next.

A drain that finds another batch to work on hands the settle of the batch it has just
delivered (delete its rows, record its failures, release its shards) to one background
thread with a database connection of its own, and reads and delivers the next batch
meanwhile: the database deletes while Python delivers. At most one settle is in flight;
the drain waits for it before handing over another one, and before it returns, so a
drain's statistics and its effects are complete on return.

Nothing about the shards changes meanwhile: they stay leased (and renewed) until their
settle releases them, so no worker, this one included, claims them in between, and the
settle is guarded by the lease as always. A process killed before the settle commits
redelivers that batch, as one killed just before a synchronous settle would.

Only backends that say so (`OutboxBackend.settles_behind`: the fast paths of PostgreSQL
and MariaDB) do this, and only while `OUTBOX_SETTLE_IN_BACKGROUND` is on. The thread
and its connection last one drain and are opened only once a second batch is found.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass

import outbox.engine.events as events
from outbox.backends.base import Lease, OutboxBackend, Settlement, SettleResult
from outbox.engine.jobs import JobThread
from outbox.engine.keeper import Holding, LeaseKeeper
from outbox.engine.rounds import release_quietly, retrying
from outbox.engine.stats import DrainStats, Round
from outbox.models import OutboxBase

logger = logging.getLogger("outbox.engine")


@dataclass
class Pending:
    """A batch's last round, delivered and not settled yet: already counted into the
    drain's statistics as if its settle deleted `expected` rows; its lease is still
    renewed (`holding`) and still lists the shards being settled."""

    lease: Lease
    round: Round
    settlement: Settlement
    expected: int
    holding: Holding


class SettleBehind:
    """Settles one drain's batches on a background thread, one at a time."""

    def __init__(self, backend: OutboxBackend, model: type[OutboxBase], using: str) -> None:
        self.backend = backend
        self.model = model
        self.using = using
        self._thread: JobThread | None = None
        self._in_flight: tuple[Pending, Future[SettleResult]] | None = None

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def submit(self, pending: Pending, stats: DrainStats) -> None:
        """Settle `pending` in the background, once the settle in flight is done (and
        counted into `stats`; if it failed, this raises and `pending` is not taken)."""
        self.wait(stats)
        if self._thread is None:
            self._thread = JobThread("outbox-settle")
        self._in_flight = (pending, self._thread.run(lambda: self._settle(pending)))

    def settle_now(self, pending: Pending, stats: DrainStats) -> None:
        """Settle `pending` in this thread, after the settle in flight (if any)."""
        try:
            self.wait(stats)
        finally:
            self._count(pending, self._settle(pending), stats)

    def wait(self, stats: DrainStats) -> None:
        """Wait for the settle in flight, if any, and count it into `stats`; raises
        what the settle raised."""
        if self._in_flight is not None:
            pending, future = self._in_flight
            self._in_flight = None
            self._count(pending, future.result(), stats)

    def catch_up(self, stats: DrainStats, pending: Pending | None = None) -> None:
        """Settle `pending` now, after the settle in flight: every batch delivered so
        far is then settled and its shards released."""
        if pending is not None:
            self.settle_now(pending, stats)
        else:
            self.wait(stats)

    def close(self, stats: DrainStats, pending: Pending | None = None) -> None:
        """`catch_up`, then end the thread and close its connection."""
        thread, self._thread = self._thread, None
        try:
            self.catch_up(stats, pending)
        finally:
            if thread is not None:
                thread.stop()

    def abandon(self, pending: Pending | None) -> None:
        """`close` while an error propagates: whatever fails here is logged, not raised."""
        try:
            self.close(DrainStats(), pending)
        except Exception:
            logger.warning("outbox could not settle a batch after an error", exc_info=True)

    def _settle(self, pending: Pending) -> SettleResult:
        """Settle the batch, then let its lease go: the keeper renews it until here. A
        settle that fails releases the shards, as a failed settle in the drain's own
        thread leaves them, before the error reaches the drain."""
        try:
            lease = pending.lease
            return retrying(lambda: self.backend.settle(self.model, lease, pending.settlement))
        except BaseException:
            release_quietly(self.backend, self.model, pending.lease)
            raise
        finally:
            LeaseKeeper.get().drop(pending.holding)

    def _count(self, pending: Pending, settled: SettleResult, stats: DrainStats) -> None:
        """Correct `stats` by what the settle did (it was counted as `expected`)."""
        lost = pending.round.lost
        lost_before = len(lost)
        lost.update(settled.lost)
        events.leases_lost(self.model, lost, self.using)
        stats.rows_retired += settled.deleted - pending.expected
        stats.leases_lost += len(lost) - lost_before
