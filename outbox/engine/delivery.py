"""Calling the receivers of one coalescing group, and what a failure of theirs means."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from outbox.backends.base import FailedGroup, Group
from outbox.categories import OutboxCategory, registry
from outbox.engine.backoff import retry_delay
from outbox.exceptions import NoReceiver, OutboxError
from outbox.models import OutboxBase
from outbox.signals import is_transactional

logger = logging.getLogger("outbox.engine")

_ERROR_LIMIT = 4000


class LeaseLost(OutboxError):
    """Raised inside a transactional delivery to roll the receiver's writes back."""


def send(model: type[OutboxBase], group: Group, retire: Callable[[], bool], using: str) -> bool:
    """Call the group's receivers with its newest payload.

    Returns True when the group's rows were already deleted, inside the receivers'
    own transaction (transactional receivers); False when the caller must retire them.
    Raises whatever a receiver raised; a category with no receiver raises NoReceiver.
    """
    category = registry.category(group.category)
    signal = model.process_signal
    kwargs = model.message_kwargs(group.message)
    if not is_transactional(signal, category):
        _send(signal, category, kwargs)
        return False
    with transaction.atomic(using=using):
        _send(signal, category, kwargs)
        if not retire():
            raise LeaseLost(f"lease of shard {group.shard} was lost")
    return True


def _send(signal: Signal, category: OutboxCategory, kwargs: dict[str, Any]) -> None:
    # An empty response list means no receiver ran: never count that as delivered.
    if not signal.send(sender=category, **kwargs):
        raise NoReceiver(f"no receiver is connected for category {category.name}")


def failure(model: type[OutboxBase], group: Group, exc: Exception) -> FailedGroup:
    """Log a receiver failure; the group's rows retry after their own back-off, and the
    shard waits for its head row's."""
    error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:_ERROR_LIMIT]
    delays = {
        row_id: retry_delay(attempts + 1)
        for row_id, attempts in zip(group.row_ids, group.attempts, strict=True)
    }
    logger.warning(
        "outbox receiver failed for shard %s category %s object %s: %s",
        group.shard,
        group.category,
        group.object_identifier,
        error,
        extra={
            "event": "outbox.delivery_failed",
            "outbox": model._meta.label,
            "shard": str(group.shard),
            "category": group.category,
            "attempts": group.attempts[0] + 1,
        },
    )
    return FailedGroup(group.shard, delays, error, delays[group.row_ids[0]])
