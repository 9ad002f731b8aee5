"""One early attempt for a backing-off shard that a new message reached.

A shard whose receiver failed waits out a back-off: its lease row has no token and
expires when the shard may be retried, and its failed rows are scheduled for then. A
message written to the shard since that failure ends the wait: after a fix is deployed
the newest state gets through at once instead of after the back-off, and a receiver
still broken is tried once per new write (however many writes came meanwhile, they
make one attempt). The attempt is an ordinary one: the failed rows keep their attempt
count, and a new failure puts the shard back on the back-off that count gives.

"Written since the failure" compares, on the database clock, a due row's
`scheduled_from` (its write; on PostgreSQL the start of the writing transaction) with
that of the shard's failed rows (their last failed attempt). A row that has failed
itself never wakes its shard, so a wake happens at most once per write. A delay a
receiver asked for (`RetryLater`, a rate limit's Retry-After) is kept.

Every backend runs this through the ORM, where a drain starts or a flush found a shard
it wrote to backing off. It reads the table's backing-off leases first (usually none),
then only the rows of those shards; rows and leases are never joined, so columns of
different collations (MariaDB) never meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Now

from outbox.exceptions import RetryLater
from outbox.models import OutboxBase, ShardLease
from outbox.shards import ShardKey

__all__ = ["wake_backed_off"]

_KEY = ("region_name", "shard_scope", "shard_identifier")
# Backing-off shards one call looks at; a flush looks at those it wrote to.
WAKE_LIMIT = 200


def wake_backed_off(
    using: str,
    model: type[OutboxBase],
    shards: Sequence[ShardKey] | None = None,
    scopes: Sequence[int] | None = None,
    identifiers: Sequence[int] | None = None,
) -> list[ShardKey]:
    """End the back-off of the shards of `model` (of `shards`, `scopes`, `identifiers`
    when given) that a due message reached since their last failure: their lease
    expires now and their failed rows are due now. Returns the shards woken."""
    leases = ShardLease.objects.using(using).of(model).backing_off()
    if shards is not None:
        leases = leases.of_shards(shards[:WAKE_LIMIT])
    if scopes:
        leases = leases.filter(shard_scope__in=scopes)
    if identifiers:
        leases = leases.filter(shard_identifier__in=identifiers)
    # Past WAKE_LIMIT shards backing off, a random choice, a fair turn for each.
    chosen = leases.order_by("?") if shards is None else leases
    backing_off = [ShardKey(*values) for values in chosen.values_list(*_KEY)[:WAKE_LIMIT]]
    if not backing_off:
        return []  # the usual case: one look at the lease table
    pending = model._default_manager.using(using).filter(dead_at__isnull=True)
    of_backing_off = pending.filter(model.of_shards(backing_off))
    failed = _back_off_of_its_own(_waiting_out_failure(of_backing_off))
    reached = failed.filter(Exists(_newer(pending, model)))
    found = reached.order_by().values_list(*model.shard_fields).distinct()
    woken = sorted({model.shard_key_of(values) for values in found})
    if woken:
        with transaction.atomic(using=using):
            # Re-checked on each lease row: one a worker took meanwhile is left alone.
            leases.of_shards(woken).update(expires_at=Now())
            rows = pending.filter(model.of_shards(woken))
            _waiting_out_failure(rows).update(scheduled_for=Now())
    return woken


def _waiting_out_failure(rows: QuerySet[Any]) -> QuerySet[Any]:
    waiting: QuerySet[Any] = rows.filter(attempts__gt=0, scheduled_for__gt=Now())
    return waiting


def _back_off_of_its_own(rows: QuerySet[Any]) -> QuerySet[Any]:
    """Failed rows on the back-off curve, not on a delay a receiver asked for with
    `RetryLater` (its error line names it): that delay is kept."""
    own: QuerySet[Any] = rows.exclude(last_error__contains=RetryLater.__name__)
    return own


def _newer(pending: QuerySet[Any], model: type[OutboxBase]) -> QuerySet[Any]:
    """The due rows of the outer failed row's shard written after its failure, and
    never attempted themselves."""
    same_shard = {name: OuterRef(name) for name in model.shard_fields}
    newer: QuerySet[Any] = pending.filter(
        **same_shard,
        attempts=0,
        scheduled_for__lte=Now(),
        scheduled_from__gt=OuterRef("scheduled_from"),
    )
    return newer
