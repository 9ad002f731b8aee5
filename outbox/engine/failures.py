"""A receiver failure recorded: the retry policy (`outbox.retry`) decides whether the
message is a dead letter and when each row is retried; this turns its answer into a
FailedGroup for the backend, logs it, and announces it by signal if anyone listens."""

from __future__ import annotations

import json
import logging
import traceback
from typing import Any

from outbox.backends.base import FailedGroup, Group
from outbox.engine.events import category_named, shard_named
from outbox.engine.receivers import DeliveryFailed
from outbox.exceptions import RetryLater
from outbox.models import OutboxBase
from outbox.models.causes import error_line
from outbox.retry import Failure, policy_for
from outbox.shown_text import one_line, shown_traceback
from outbox.signals import delivery_failed, message_dead_lettered

logger = logging.getLogger("outbox.engine")

_ERROR_LIMIT = 4000
_TRACEBACK_LIMIT = 20000
_FAILED = "outbox receiver failed for message %s, shard %s category %s object %s (attempt %s)%s: %s"


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
    described = _describe(named)
    failed = FailedGroup(
        group.shard,
        delays,
        described[:_ERROR_LIMIT],
        delays[group.row_ids[0]],
        traceback="\n".join(_format(error) for error in errors)[-_TRACEBACK_LIMIT:],
        delivered_to=_encode(done),
        asked_later=all(isinstance(error, RetryLater) for error in errors),
    )
    _announce(model, group, errors[0], described, dead, using)
    return failed, dead


def _describe(named: list[tuple[str, Exception]]) -> str:
    # Each failure names its receiver, a lone one too: dead letters are grouped by it.
    return "\n".join(error_line(name, exc) for name, exc in named)


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _encode(done: list[str]) -> str:
    return json.dumps(sorted(set(done))) if done else ""


def _announce(
    model: type[OutboxBase],
    group: Group,
    exc: Exception,
    described: str,
    dead: bool,
    using: str,
) -> None:
    """Log the failure and send the signals; they carry the error as recorded, the log
    shows it cut with a marker saying how much of `described` went."""
    common = {
        "shard": group.shard,
        "category": group.category,
        "object_identifier": group.object_identifier,
        "attempts": group.attempts[0] + 1,
        "message_id": getattr(group.message, "message_id", None),
        "error": described[:_ERROR_LIMIT],
        "using": using,
    }
    _log(model, exc, dead, common, one_line(described))
    if delivery_failed.has_listeners(model):
        delivery_failed.send(sender=model, exception=exc, dead=dead, **common)
    if dead and message_dead_lettered.has_listeners(model):
        message_dead_lettered.send(sender=model, **common)


def _log(
    model: type[OutboxBase], exc: Exception, dead: bool, failure: dict[str, Any], shown: str
) -> None:
    """Log the failure with the receivers' text as `shown` (escaped and cut by
    `outbox.shown_text`) and a traceback made the same way: it can neither forge a log
    line, nor reach a terminal as escapes, nor make a huge record. The exception still
    goes with the record (`exc_info`), for the handlers that read it."""
    level = logging.ERROR if dead else logging.WARNING
    if not logger.isEnabledFor(level):
        return
    shard = failure["shard"]
    args = (
        failure["message_id"],
        shard_named(shard),
        category_named(failure["category"]),
        failure["object_identifier"],
        failure["attempts"],
        ", dead-lettered" if dead else ", will retry",
        shown,
    )
    path, line, function, _ = logger.findCaller()
    record = logger.makeRecord(
        logger.name,
        level,
        path,
        line,
        _FAILED,
        args,
        (type(exc), exc, exc.__traceback__),
        function,
        extra={
            "event": "outbox.dead_lettered" if dead else "outbox.delivery_failed",
            "outbox": model._meta.label,
            "scope": shard.shard_scope,
            "shard": str(shard),
            "category": failure["category"],
            "object_identifier": failure["object_identifier"],
            "attempts": failure["attempts"],
            "message_id": str(failure["message_id"]),
        },
    )
    # A formatter writes `exc_text`, when set, in place of the traceback it would
    # format from `exc_info`, which repeats the receiver's text as it is.
    record.exc_text = shown_traceback(exc, _TRACEBACK_LIMIT)
    logger.handle(record)
