"""Working one leased batch: read its shards window by window, call the receivers of
each group, settle each round (or hand the last one back to be settled behind).

`BatchWorker` does what a drain does with a batch it has claimed; `Drainer`
(`outbox.engine.table`) claims the batches and decides when each is worked on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import outbox.engine.events as events
from outbox.backends.base import Lease, OutboxBackend, Window
from outbox.conf import outbox_settings
from outbox.engine.gc_pause import collector_paused
from outbox.engine.leases import Holding, LeaseKeeper, release_quietly, retrying
from outbox.engine.pipeline import Unsettled
from outbox.engine.rounds import DrainStats, Round, cut_at_bounds, done_shards
from outbox.engine.shard_delivery import ShardDeliverer
from outbox.engine.slots import SlotPool, deliver_window
from outbox.engine.stragglers import Stragglers
from outbox.models import OutboxBase
from outbox.shards import ShardKey


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
                    self._deliver(window, holding, round_)
                    delivered = defer and not round_.running
                finally:
                    done, finished = self._round_end(active, window, reached, round_)
                    if delivered and all(key in finished for key in active):
                        pending = self._defer(lease, round_, done, holding, stats)
                    else:
                        self._settle(lease, round_, done, stats)
                    # Stragglers keep leases of their own (`outbox.engine.stragglers`).
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
        timed = events.wants_processed(self.model)
        with collector_paused():
            return self.backend.read_window(self.model, shards, self.window_rows(), timed=timed)

    def release_remaining(self, lease: Lease) -> None:
        if lease.shards and release_quietly(self.backend, self.model, lease):
            lease.shards = []

    def _deliver(self, window: Window, holding: Holding, round_: Round) -> None:
        """Deliver the window's groups into `round_`, shard after shard, or on the slots
        (`outbox.engine.slots`) during a drain with concurrency."""
        # Receivers and lifecycle listeners are looked up once per window.
        self._report_processed = events.wants_processed(self.model)
        if self.slots is not None:  # a lone shard too: its call may hang
            self._deliver_on_slots(self.slots, window, holding, round_)
            return
        deliverer = self._deliverer(holding)
        # The mean call is taken over the window as a whole, not timed call by call: what
        # the engine adds per call is far below what tells a waiting receiver apart.
        calls, started = round_.receiver_calls, time.monotonic()
        deliverer.deliver_each(window.shards.items(), round_, holding)
        if round_.receiver_calls > calls:
            self._calls += round_.receiver_calls - calls
            self._call_seconds += time.monotonic() - started

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
        for task in (*run.finished, *run.carved):
            self._calls += task.calls
            self._call_seconds += task.call_seconds
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
        settlement = round_.settlement(done)
        settled = retrying(self.backend, lambda: self.backend.settle(self.model, lease, settlement))
        round_.lost.update(settled.lost)
        events.leases_lost(self.model, round_.lost, self.using)
        round_.add_to(stats, settled.deleted)

    def _defer(
        self, lease: Lease, round_: Round, done: list[ShardKey], holding: Holding, stats: DrainStats
    ) -> Unsettled:
        """The round, to settle later, counted now as if it deleted what it delivered."""
        settlement = round_.settlement(done)
        expected = sum(len(row_ids) for row_ids in round_.delivered.values())
        round_.add_to(stats, expected)
        return Unsettled(lease, round_, settlement, expected, holding)
