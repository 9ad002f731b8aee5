"""Eager delivery: the synchronous flush, run inside a test's open transaction (after a
real commit it is `outbox.engine.drain.flush_shards`).

A `django.test.TestCase` never commits; under `captureOnCommitCallbacks(execute=True)`
the on_commit callbacks run with its transaction still open, where the engine refuses
to claim leases (they protect nothing until committed). `deliver_eagerly` delivers
there instead: it reads the pending rows of the written shards, coalesces them per
group as the engine does (shard + category + object_identifier, newest payload), stops
a shard at its bound and at its first row that is not due, calls the receivers through
the engine's own delivery (so several receivers, transactional receivers, RetryLater and
PermanentFailure behave as in production) and deletes the delivered rows. No leases:
nothing else can see the test's transaction.

The write path calls it for its flush run inside `TestCase`'s own transactions
(`outbox.writes.context`, where `OutboxConfig.ready` installs it); `outbox.testing`
builds its helpers on it.

A failing receiver is handled as the engine handles it (logged, `delivery_failed`
sent, the attempt recorded on its rows, which are rescheduled or dead-lettered, and its
shard stops there); with `raise_errors=True` the error is raised out of the flush too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import outbox.engine.delivery as delivery
from outbox.backends.base import Group, Settlement
from outbox.backends.portable import PortableBackend
from outbox.conf import outbox_settings
from outbox.engine.pipeline import cut_at_bounds, report_processed
from outbox.models import OutboxBase
from outbox.shards import ShardKey


def deliver_eagerly(
    using: str,
    bounds: Mapping[type[OutboxBase], Mapping[ShardKey, int | None]],
    *,
    raise_errors: bool = False,
) -> int:
    """Deliver the shards in `bounds` up to their bounds (None: to the end) inside the
    current transaction; returns the groups delivered (one receiver call each)."""
    delivered = 0
    for model, shard_bounds in bounds.items():
        delivered += _EagerTable(model, using, raise_errors).deliver(shard_bounds)
    return delivered


class _EagerTable:
    """One table's eager flush: read, deliver, delete, window by window."""

    def __init__(self, model: type[OutboxBase], using: str, raise_errors: bool) -> None:
        self.model = model
        self.using = using
        self.raise_errors = raise_errors
        # The portable read on every database: its due check is the ORM's Now(), the
        # statement's time, while the PostgreSQL fast path's now() is the start of the
        # transaction, long past in a test, so rows written since would not be due.
        self.backend = PortableBackend(using)

    def deliver(self, bounds: Mapping[ShardKey, int | None]) -> int:
        delivered = 0
        active = list(bounds)
        while active:
            window = self.backend.read_window(self.model, active, outbox_settings.BATCH_ROWS)
            reached = cut_at_bounds(window, bounds)
            stopped = set()
            for shard, groups in window.shards.items():
                for group in groups:
                    if not self._deliver_group(group):
                        stopped.add(shard)
                        break
                    delivered += 1
            finished = {key for key in active if key not in window.incomplete} | reached | stopped
            active = [key for key in active if key not in finished]
        return delivered

    def _deliver_group(self, group: Group) -> bool:
        """Deliver one group; False when its shard must stop here."""
        if group.message is None:
            return False
        started = time.monotonic()
        try:
            retired = delivery.send(self.model, group, lambda: self._retire(group), self.using)
        except Exception as exc:
            return self._failed(group, exc)
        if not retired:
            self._retire(group)
        report_processed(self.model, group, time.monotonic() - started, self.using)
        return True

    def _retire(self, group: Group) -> bool:
        self.backend.settle_unleased(self.model, Settlement(delivered={group.shard: group.row_ids}))
        return True

    def _failed(self, group: Group, exc: Exception) -> bool:
        """Record the failure as the engine would; True when the shard goes on (the
        group became a dead letter)."""
        failed, dead = delivery.judge(self.model, group, exc, self.using)
        outcome = Settlement(dead=[failed]) if dead else Settlement(failed=[failed])
        self.backend.settle_unleased(self.model, outcome)
        if self.raise_errors:
            errors = exc.errors if isinstance(exc, delivery.DeliveryFailed) else []
            # One failing receiver: its own error, as the test wrote it.
            raise errors[0][1] if len(errors) == 1 else exc
        return dead
