"""What a receiver failure means: retry after a back-off, retry when the receiver asked,
or give the message up as a dead letter. Logged, and announced by signal if anyone
listens."""

from __future__ import annotations

import json
import logging
import random
import traceback

from outbox.backends.base import FailedGroup, Group
from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.engine.events import category_named, shard_named
from outbox.engine.receivers import DeliveryFailed
from outbox.exceptions import NoReceiver, OutboxError, PermanentFailure, RetryLater
from outbox.models import OutboxBase
from outbox.models.causes import error_line
from outbox.signals import delivery_failed, message_dead_lettered

logger = logging.getLogger("outbox.engine")

_ERROR_LIMIT = 4000
_TRACEBACK_LIMIT = 20000


def retry_delay(attempt: int) -> float:
    """Seconds to wait before attempt number `attempt + 1`, after `attempt` failures.

    The ceiling doubles per failure up to OUTBOX_BACKOFF_MAX_SECONDS; the delay is drawn
    between half the ceiling and the ceiling, so failed shards do not retry in step.
    """
    base = outbox_settings.BACKOFF_BASE_SECONDS
    cap = outbox_settings.BACKOFF_MAX_SECONDS
    ceiling = min(cap, base * 2 ** min(max(attempt, 1) - 1, 62))
    return random.uniform(ceiling / 2, ceiling)


def max_attempts(category: int) -> int:
    """The category's own limit if it sets one, else OUTBOX_MAX_ATTEMPTS; 0 is none."""
    try:
        own = registry.category(category).max_attempts()
    except OutboxError:
        own = None
    return outbox_settings.MAX_ATTEMPTS if own is None else own


def is_dead(group: Group, errors: list[Exception]) -> bool:
    """A permanent failure dead-letters at once; exhausted attempts do (a missing
    receiver never does: the message waits for its receiver to be connected)."""
    if any(isinstance(exc, PermanentFailure) for exc in errors):
        return True
    if any(isinstance(exc, NoReceiver) for exc in errors):
        return False
    limit = max_attempts(group.category)
    return limit > 0 and group.attempts[0] + 1 >= limit


def row_delays(group: Group, errors: list[Exception]) -> dict[int, float]:
    """Each row's delay: its own back-off (capped at the head row's, so the whole group
    is due when its shard may retry), or the delay a RetryLater asked for, whichever is
    longer when receivers disagree."""
    # At least a second: a receiver asking for 0 must not spin its shard in a tight loop.
    asked = [max(exc.delay_seconds, 1.0) for exc in errors if isinstance(exc, RetryLater)]
    if asked and all(isinstance(exc, RetryLater) for exc in errors):
        return dict.fromkeys(group.row_ids, max(asked))
    delays = {
        row_id: retry_delay(attempts + 1)
        for row_id, attempts in zip(group.row_ids, group.attempts, strict=True)
    }
    head = max([delays[group.row_ids[0]], *asked])
    capped = {row_id: min(delay, head) for row_id, delay in delays.items()}
    capped[group.row_ids[0]] = head
    return capped


def judge(
    model: type[OutboxBase], group: Group, exc: Exception, using: str
) -> tuple[FailedGroup, bool]:
    """Turn a failed delivery into a FailedGroup, and whether it is dead; log it and send
    the lifecycle signals."""
    named = exc.errors if isinstance(exc, DeliveryFailed) else [("", exc)]
    done = exc.delivered_to if isinstance(exc, DeliveryFailed) else []
    errors = [error for _, error in named]
    dead = is_dead(group, errors)
    delays = dict.fromkeys(group.row_ids, 0.0) if dead else row_delays(group, errors)
    error = _describe(named)
    failed = FailedGroup(
        group.shard,
        delays,
        error,
        delays[group.row_ids[0]],
        traceback="\n".join(_format(error) for error in errors)[-_TRACEBACK_LIMIT:],
        delivered_to=_encode(done),
        asked_later=all(isinstance(error, RetryLater) for error in errors),
    )
    _announce(model, group, errors[0], error, dead, using)
    return failed, dead


def _describe(named: list[tuple[str, Exception]]) -> str:
    # Each failure names its receiver, a lone one too: dead letters are grouped by it.
    return "\n".join(error_line(name, exc) for name, exc in named)[:_ERROR_LIMIT]


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _encode(done: list[str]) -> str:
    return json.dumps(sorted(set(done))) if done else ""


def _announce(
    model: type[OutboxBase],
    group: Group,
    exc: Exception,
    error: str,
    dead: bool,
    using: str,
) -> None:
    attempts = group.attempts[0] + 1
    shard = group.shard
    message_id = getattr(group.message, "message_id", None)
    logger.log(
        logging.ERROR if dead else logging.WARNING,
        "outbox receiver failed for message %s, shard %s category %s object %s (attempt %s)%s: %s",
        message_id,
        shard_named(shard),
        category_named(group.category),
        group.object_identifier,
        attempts,
        ", dead-lettered" if dead else ", will retry",
        error,
        exc_info=exc,
        extra={
            "event": "outbox.dead_lettered" if dead else "outbox.delivery_failed",
            "outbox": model._meta.label,
            "scope": shard.shard_scope,
            "shard": str(shard),
            "category": group.category,
            "object_identifier": group.object_identifier,
            "attempts": attempts,
            "message_id": str(message_id),
        },
    )
    common = {
        "shard": shard,
        "category": group.category,
        "object_identifier": group.object_identifier,
        "attempts": attempts,
        "message_id": message_id,
        "error": error,
        "using": using,
    }
    if delivery_failed.has_listeners(model):
        delivery_failed.send(sender=model, exception=exc, dead=dead, **common)
    if dead and message_dead_lettered.has_listeners(model):
        message_dead_lettered.send(sender=model, **common)
