"""(d) The reference design (Sentry's in-house outbox), written plainly with the ORM.

Its drain algorithm, step for step, against the same RegionOutbox table and receivers:

1. `find_scheduled_shards`: one GROUP BY over the due rows returning every due shard,
   ordered by (min scheduled_for, max id). Unbounded, as in the reference: its batches
   are id ranges handed to Celery tasks, not a shard count, so the bench batch size
   does not apply (one pass here sees the whole backlog, which favours it).
2. `prepare_next_from_shard`: in a transaction, lock the shard's first row
   (`select_for_update(nowait=True)`) and push the whole shard's `scheduled_for` ahead
   (its retry scheme: rows still there at the next schedule are tried again).
3. `drain_shard(flush_all=True)`: repeat { in one transaction: lock the shard head
   (nowait); read the head's coalescing group's newest and oldest row; call the
   receivers inside that transaction; delete the group's older rows in batches of 50
   ids, then the newest row } until the shard is empty.

Left out, in its favour: metrics, tracing spans and the per-shard kill-switch lookup.
The reference's table has an index on the coalescing columns; this one is
RegionOutbox's (shard, id) index, which serves the same per-shard reads.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, cast

from django.db import OperationalError, transaction
from django.db.models import Max, Min, QuerySet
from django.utils import timezone

SHARD_COLUMNS = ("shard_scope", "shard_identifier")
DELETE_BATCH = 50


def _lock_not_available(exc: OperationalError) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == "55P03"


def _messages_in_shard(shard: dict[str, Any]) -> QuerySet[Any]:
    from outbox.models import RegionOutbox

    return cast("QuerySet[Any]", RegionOutbox.objects.filter(**shard))


def find_scheduled_shards() -> list[dict[str, Any]]:
    """Every shard with a due row, earliest schedule first."""
    from outbox.models import RegionOutbox

    heads = (
        RegionOutbox.objects.values(*SHARD_COLUMNS)
        .filter(scheduled_for__lte=timezone.now())
        .annotate(first_scheduled=Min("scheduled_for"), max_id=Max("id"))
        .order_by("first_scheduled", "max_id")
    )
    return [{column: head[column] for column in SHARD_COLUMNS} for head in heads]


def prepare_next_from_shard(shard: dict[str, Any]) -> Any:
    """Lock the shard's first row and reschedule the shard; None if empty or locked."""
    try:
        with transaction.atomic(savepoint=False):
            head = _messages_in_shard(shard).order_by("id").select_for_update(nowait=True).first()
            if head is None:
                return None
            now = timezone.now()
            last_delay = max(head.scheduled_for - head.scheduled_from, timedelta(seconds=1))
            _messages_in_shard(shard).update(
                scheduled_for=now + min(last_delay * 2, timedelta(hours=1)), scheduled_from=now
            )
            return head
    except OperationalError as exc:
        if _lock_not_available(exc):
            return None  # someone else is draining it
        raise


def _process_group(head: Any) -> int:
    """Deliver the head's coalescing group inside the caller's transaction; rows deleted."""
    from outbox.categories import registry
    from outbox.models import RegionOutbox

    group = _messages_in_shard({column: getattr(head, column) for column in SHARD_COLUMNS})
    group = group.filter(category=head.category, object_identifier=head.object_identifier)
    newest = group.last()
    oldest = group.first() or newest  # the reference reads it for its lag metrics
    if newest is None or oldest is None:
        return 0
    kwargs = head.message_kwargs(newest)
    head.process_signal.send(sender=registry.category(newest.category), **kwargs)
    deleted = 0
    while True:
        batch = group.values_list("id", flat=True)[:DELETE_BATCH]
        older = [row_id for row_id in batch if row_id < newest.id]
        if not older:
            break
        RegionOutbox.objects.filter(id__in=older).delete()
        deleted += len(older)
    newest.delete()
    return deleted + 1


def drain_shard(shard: dict[str, Any], deadline: float) -> tuple[int, int]:
    """Deliver the shard group by group, one transaction (holding the head lock) each.

    Returns (groups delivered, rows deleted); stops early at the deadline.
    """
    groups = rows = 0
    while time.monotonic() < deadline:
        with transaction.atomic():
            try:
                head = _messages_in_shard(shard).select_for_update(nowait=True).first()
            except OperationalError as exc:
                if not _lock_not_available(exc):
                    raise
                head = None
            deleted = _process_group(head) if head is not None else 0
            if not deleted:
                return groups, rows
        groups += 1
        rows += deleted
    return groups, rows


def run(budget: float) -> dict[str, Any]:
    from bench import receivers
    from outbox.models import RegionOutbox

    deadline = time.monotonic() + budget
    groups = rows = passes = 0
    complete = False
    while time.monotonic() < deadline:
        shards = find_scheduled_shards()
        passes += 1
        if not shards:
            if RegionOutbox.objects.exists():
                raise RuntimeError("reference drain: rows left but none due")
            complete = True
            break
        for shard in shards:
            if time.monotonic() >= deadline:
                break
            if prepare_next_from_shard(shard) is not None:
                shard_groups, shard_rows = drain_shard(shard, deadline)
                groups += shard_groups
                rows += shard_rows
    return {
        "rows_retired": rows,
        "receiver_calls": receivers.total_calls(),
        "groups": groups,
        "passes": passes,
        "complete": complete,
    }
