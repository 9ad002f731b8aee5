"""A receiver failure recorded: the retry policy (`outbox.retry`) decides whether the
message is a dead letter and when each row is retried; this turns its answer into a
FailedGroup for the backend, logs it, and announces it by signal if anyone listens."""

from __future__ import annotations

import json
import logging
import traceback

from outbox.backends.base import FailedGroup, Group
from outbox.engine.events import category_named, shard_named
from outbox.engine.receivers import DeliveryFailed
from outbox.exceptions import RetryLater
from outbox.models import OutboxBase
from outbox.models.causes import error_line
from outbox.retry import Failure, policy_for
from outbox.signals import delivery_failed, message_dead_lettered

logger = logging.getLogger("outbox.engine")

_ERROR_LIMIT = 4000
_TRACEBACK_LIMIT = 20000


def judge(
    model: type[OutboxBase], group: Group, exc: Exception, using: str
) -> tuple[FailedGroup, bool]:
    """Turn a failed delivery into a FailedGroup, and whether it is dead; log it and send
    the lifecycle signals."""
    named = exc.errors if isinstance(exc, DeliveryFailed) else [("", exc)]
    done = exc.delivered_to if isinstance(exc, DeliveryFailed) else []
    errors = [error for _, error in named]
    policy = policy_for(group.category)
    failure = Failure(group.category, tuple(group.attempts), tuple(errors))
    dead = policy.is_final(failure)
    if dead:
        delays = dict.fromkeys(group.row_ids, 0.0)
    else:
        delays = dict(zip(group.row_ids, policy.row_delays(failure), strict=True))
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
