"""How a drainer takes shards of its table: claims through the backend under the
drainer's filters, resuming after the last shard won so that every shard gets its turn,
and the early wake of backing-off shards that a new message reached."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import outbox.engine.events as events
from outbox.backends.base import Lease, ShardFilter, Window
from outbox.conf import outbox_settings
from outbox.engine.batch import BatchWorker
from outbox.engine.leases import retrying
from outbox.shards import ShardKey


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
        events.claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
        if shards is None and lease.shards:
            self.cursor = lease.shards[-1]
        return lease

    def claim_and_read(self, lease: Lease, shards: tuple[ShardKey, ...]) -> Window | None:
        """Claim `shards` and read the won ones in one step where the backend can (and
        no scope or identifier filter applies); None: claim, then read."""
        if self.scopes or self.identifiers:
            return None
        started = time.monotonic()  # the claim's duration includes its read here
        try:
            rows = self._batch.window_rows()
            timed = events.wants_processed(self.model)  # the lag needs date_added
            window = retrying(
                self.backend,
                lambda: self.backend.claim_and_read(self.model, lease, shards, rows, timed=timed),
            )
        except BaseException:
            self._batch.release_remaining(lease)  # won, then failed reading: let them go now
            raise
        if window is not None:
            events.claimed(self.model, len(lease.shards), time.monotonic() - started, self.using)
        return window

    def _filter(self, shards: tuple[ShardKey, ...] | None) -> ShardFilter:
        return ShardFilter(
            shards=shards,
            scopes=self.scopes,
            identifiers=self.identifiers,
            after=self.cursor if shards is None else None,
            small=self.small and shards is None,
        )
