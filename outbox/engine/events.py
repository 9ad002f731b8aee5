"""Lifecycle signals of the drain that are not failures: a message processed, a lease
lost. Each is sent only when it has a receiver, so an unused signal costs one check."""

from __future__ import annotations

import logging
from datetime import datetime
from datetime import timezone as dt_timezone

from django.utils import timezone

from outbox.backends.base import Group
from outbox.categories import registry
from outbox.models import OutboxBase
from outbox.shards import ShardKey
from outbox.signals import lease_lost, message_processed, receivers_stuck, shards_claimed

logger = logging.getLogger("outbox.engine")


def lag_seconds(group: Group) -> float | None:
    """The newest row's age now, from its `date_added` (database clock); None when the
    read did not carry it (a backend is not obliged to)."""
    added = getattr(group.message, "date_added", None)
    if not isinstance(added, datetime):
        return None
    if timezone.is_naive(added):
        added = timezone.make_aware(added, dt_timezone.utc)
    return max((timezone.now() - added).total_seconds(), 0.0)


def wants_processed(model: type[OutboxBase]) -> bool:
    """Whether `message_processed` has a receiver for `model` (checked once per window:
    the check costs more than a delivery's bookkeeping)."""
    return message_processed.has_listeners(model)


def processed(model: type[OutboxBase], group: Group, duration: float, using: str) -> None:
    if not message_processed.has_listeners(model):
        return
    send_processed(model, group, duration, using)


def send_processed(
    model: type[OutboxBase],
    group: Group,
    duration: float,
    using: str,
    receiver_seconds: dict[str, float] | None = None,
) -> None:
    message_processed.send(
        sender=model,
        shard=group.shard,
        category=group.category,
        object_identifier=group.object_identifier,
        rows=len(group.row_ids),
        lag_seconds=lag_seconds(group),
        duration_seconds=duration,
        receiver_seconds=receiver_seconds or {},
        using=using,
    )


def claimed(model: type[OutboxBase], shards: int, duration: float, using: str) -> None:
    if shards_claimed.has_listeners(model):
        shards_claimed.send(sender=model, shards=shards, duration_seconds=duration, using=using)


def leases_lost(model: type[OutboxBase], shards: set[ShardKey], using: str) -> None:
    for key in sorted(shards):
        logger.warning(
            "outbox lease lost on shard %s before its delete; it will be redelivered",
            registry.shard_name(key, "noted"),
            extra={
                "event": "outbox.lease_lost",
                "outbox": model._meta.label,
                "scope": key.shard_scope,
                "shard": str(key),
            },
        )
        if lease_lost.has_listeners(model):
            lease_lost.send(sender=model, shard=key, using=using)


def stuck(model: type[OutboxBase], count: int, using: str) -> None:
    """The number of this process's stuck receiver threads changed to `count`."""
    if not receivers_stuck.has_listeners(model):
        return
    try:
        receivers_stuck.send(sender=model, count=count, using=using)
    except Exception:  # sent from a slot thread on its way out, too
        logger.exception("A receivers_stuck receiver failed")
