"""Receivers whose writes are applied once per message: the inbox.

`inbox_receiver` connects a receiver that runs in a transaction on the outbox's
database, together with an `InboxRecord` of (receiver name, message id). The record's
unique constraint makes the second delivery of a message wait for the first one's
transaction: if that committed, the second finds the record and skips the call (sends
`duplicate_skipped`); if it rolled back, the second runs the receiver. So the receiver's
writes to that database commit once per message, whatever the engine redelivers (a
killed worker, a lease taken over, a call given up at its timeout).

Records are pruned after `OUTBOX_INBOX_RETENTION_SECONDS` (`prune_inbox`, run by
`drain_outboxes --loop` on its heartbeat and by `outbox_prune_inbox`); a system check
refuses a retention shorter than a message can be redelivered.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError, connections, router, transaction
from django.dispatch import Signal

from outbox.categories import OutboxCategory
from outbox.conf import outbox_settings
from outbox.exceptions import OutboxConfigurationError
from outbox.signals import check_sender, duplicate_skipped

logger = logging.getLogger("outbox.inbox")

_Receiver = TypeVar("_Receiver", bound=Callable[..., Any])

# Inbox receivers by name (the function each name applies): the checks and the pruning
# look for them, and a name stays with one function, since its records say what that
# function applied.
inbox_receivers: dict[str, Callable[..., Any]] = {}

# The length of InboxRecord.receiver (the model cannot be imported before the apps load;
# a test keeps the two equal).
RECEIVER_NAME_LENGTH = 255

PRUNE_SLICE_ROWS = 1000


def inbox_receiver(
    signal: Signal, *, sender: OutboxCategory, name: str | None = None
) -> Callable[[_Receiver], _Receiver]:
    """Connect a receiver whose writes go to the outbox's database, applied once per
    message (see the module's docstring).

    `name` identifies the receiver in its records (default: ``module.qualname``): keep
    it when you move or rename the function, or messages applied under the old name
    are applied again. Two functions cannot share a name; one function may be connected
    for several categories (stack the decorator). Returns the connected receiver (call
    it as the engine does, with ``message_id`` and ``using``).
    """

    def decorator(func: _Receiver) -> _Receiver:
        # Stacked: connect the function itself again, not the other category's wrapper
        # (which would record the message first and make this one skip it).
        func = getattr(func, "inbox_applies", func)
        signal_name = getattr(signal, "name", "the signal")
        check_sender(signal_name, func, sender)
        if inspect.iscoroutinefunction(func):
            raise OutboxConfigurationError(
                f"inbox_receiver cannot connect {func.__qualname__}: it is async def, and "
                "its writes must share the inbox record's transaction. Make it a plain def."
            )
        key = _name(func, name)

        @functools.wraps(func)
        def apply_once(*, message_id: Any, using: str, **kwargs: Any) -> Any:
            with transaction.atomic(using=using):
                if _applied_before(key, message_id, using):
                    _skipped(key, message_id, kwargs.get("sender"), using)
                    return None
                return func(message_id=message_id, using=using, **kwargs)

        apply_once.inbox_applies = func  # type: ignore[attr-defined]
        signal.connect(apply_once, sender=sender, weak=False)
        inbox_receivers[key] = func
        return apply_once  # type: ignore[return-value]

    return decorator


def _name(func: Callable[..., Any], name: str | None) -> str:
    """The receiver's name in its records, refused when too long or another's."""
    key = name or f"{func.__module__}.{func.__qualname__}"
    if len(key) > RECEIVER_NAME_LENGTH:
        raise OutboxConfigurationError(
            f"inbox receiver name {key!r} is over {RECEIVER_NAME_LENGTH} characters."
        )
    if inbox_receivers.get(key, func) is not func:
        raise OutboxConfigurationError(
            f"inbox receiver name {key!r} is taken by another receiver: its records would "
            "make each skip the messages the other applied. Pass a name of its own."
        )
    return key


def _applied_before(key: str, message_id: Any, using: str) -> bool:
    """Write the record, in a savepoint so a duplicate leaves the transaction usable."""
    from outbox.models import InboxRecord  # the package imports this before apps load

    try:
        with transaction.atomic(using=using):
            InboxRecord.objects.using(using).create(receiver=key, message_id=message_id)
    except IntegrityError:
        return True
    return False


def _skipped(key: str, message_id: Any, category: Any, using: str) -> None:
    from outbox.models import InboxRecord

    logger.info(
        "outbox inbox receiver %s already applied message %s: skipped",
        key,
        message_id,
        extra={"event": "outbox.duplicate_skipped", "receiver": key, "message_id": str(message_id)},
    )
    # A listener that raises must not turn the skip into a failed delivery.
    for listener, error in duplicate_skipped.send_robust(
        InboxRecord, receiver=key, message_id=message_id, category=category, using=using
    ):
        if isinstance(error, Exception):
            logger.error("outbox duplicate_skipped listener %r raised", listener, exc_info=error)


def prune_inbox(using: str, *, rows: int = PRUNE_SLICE_ROWS, seconds: float = 0.0) -> int:
    """Delete the records older than OUTBOX_INBOX_RETENTION_SECONDS, `rows` at a time,
    each slice its own statement; stop after `seconds` (0: until none is left).
    Returns how many were deleted."""
    from outbox.models import InboxRecord

    retention = outbox_settings.INBOX_RETENTION_SECONDS
    records = InboxRecord.objects.using(using)
    deadline = time.monotonic() + seconds if seconds else None
    deleted = 0
    while True:
        went: int = records.prune_slice(retention, rows)
        deleted += went
        if went < rows or (deadline is not None and time.monotonic() >= deadline):
            return deleted


def inbox_databases() -> list[str]:
    """The databases the project's routers let the inbox table migrate to."""
    from outbox.models import InboxRecord

    return [alias for alias in connections if router.allow_migrate_model(alias, InboxRecord)]
