"""The signals receivers connect to, with a category member as ``sender``.

``process_region_outbox`` is sent with ``object_identifier``, ``shard_identifier``,
``shard_scope``, ``payload``, ``message_id``, ``attempt``, ``headers`` and ``using`` (the
outbox's database alias); ``process_control_outbox`` adds ``region_name``,
``date_added`` and ``scheduled_for``. Receivers must be idempotent: a message is
delivered at least once, and again if a worker dies before its delete commits.

`connect` refuses a ``sender`` that is not an `OutboxCategory` member (a plain int, a
foreign enum), naming the receiver and the fix, since the engine only ever sends category
members and such a receiver would never run. ``sender=None`` (the default) stays allowed:
the receiver gets every category's messages, like any Django receiver without a sender,
and counts as a receiver of every category for the `outbox.W001` check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import models
from django.dispatch import Signal

from outbox.categories import OutboxCategory, registry
from outbox.exceptions import OutboxConfigurationError


class OutboxSignal(Signal):
    """A Signal that caches its receivers per category, as the engine sends one per message.

    Django's own per-sender cache is a WeakKeyDictionary, and category members (ints)
    cannot be weakly referenced. They live as long as the process, so a plain dict does
    the job; connect() and disconnect() clear it as they clear Django's.
    """

    def __init__(self, name: str = "an outbox signal") -> None:
        super().__init__(use_caching=True)
        self.name = name
        self.sender_receivers_cache = {}

    def connect(
        self,
        receiver: Callable[..., Any],
        sender: object | None = None,
        weak: bool = True,
        dispatch_uid: Any = None,
    ) -> None:
        """Connect `receiver` to the messages of one category (`sender`), or of all (None)."""
        if sender is not None:
            check_sender(self.name, receiver, sender)
        super().connect(receiver, sender, weak, dispatch_uid)


def check_sender(signal_name: str, receiver: Callable[..., Any], sender: object) -> None:
    """Raise OutboxConfigurationError unless `sender` is a category member."""
    if isinstance(sender, OutboxCategory):
        return
    name = getattr(receiver, "__qualname__", None) or repr(receiver)
    where = f"{getattr(receiver, '__module__', None) or '?'}.{name}"
    known = registry.categories.get(sender) if isinstance(sender, int) else None
    example = f"{type(known).__name__}.{known.name}" if known else "Category.SOME_UPDATE"
    raise OutboxConfigurationError(
        f"Receiver {where} is connected to {signal_name} with sender={sender!r} "
        f"({type(sender).__name__}), which is not an OutboxCategory member: the engine "
        f"sends each message with its category member, so it would never run. Connect it "
        f"with the member, e.g. @receiver({signal_name}, sender={example}), or with no "
        f"sender to receive every category."
    )


process_region_outbox = OutboxSignal("process_region_outbox")
process_control_outbox = OutboxSignal("process_control_outbox")

_Receiver = TypeVar("_Receiver", bound=Callable[..., Any])

# (id(signal), category) pairs whose messages are delivered inside the transaction that
# deletes their rows: the engine looks a pair up in this set as it routes a category.
transactional_pairs: set[tuple[int, OutboxCategory]] = set()


def transactional_receiver(
    signal: Signal, *, sender: OutboxCategory, **connect_kwargs: Any
) -> Callable[[_Receiver], _Receiver]:
    """Connect a receiver whose writes go to the outbox's own database.

    Messages of ``sender`` are then delivered inside the transaction that deletes their
    rows, so the receiver's writes commit exactly once, together with the delete. Every
    receiver of that category runs inside that transaction.
    """

    def decorator(func: _Receiver) -> _Receiver:
        check_sender(getattr(signal, "name", "the signal"), func, sender)
        signal.connect(func, sender=sender, **connect_kwargs)
        transactional_pairs.add((id(signal), sender))
        return func

    return decorator


# Lifecycle signals: sent by the engine (and the write path, for `messages_saved`) with
# the outbox model as `sender`. Connect to them for logging, tracing or metrics
# (`outbox.metrics` does); a signal with no receiver costs one check. Keyword arguments
# (every signal also gets `using`, the database alias):
#
# - messages_saved: `rows` (the outbox rows written, in one save or bulk insert).
# - message_processed: `shard` (ShardKey), `category` (int), `object_identifier`,
#   `rows` (rows retired with it, coalesced ones included), `lag_seconds` (the newest
#   row's age when delivered, or None if unknown), `duration_seconds` (the receivers'
#   time), `receiver_seconds` (each receiver called for it, by `module.qualname`, and
#   its own time in seconds).
# - delivery_failed: `shard`, `category`, `object_identifier`, `attempts` (including
#   this one), `error` (text), `exception`, `dead` (True when this failure dead-lettered
#   the message).
# - message_dead_lettered: `shard`, `category`, `object_identifier`, `attempts`,
#   `error`.
# - lease_lost: `shard`.
# - shards_claimed: `shards` (how many the claim won, maybe 0), `duration_seconds` (the
#   claim's time, its statements and retries included).
# - receivers_stuck: `count` (this process's receiver calls of this outbox table given
#   up at OUTBOX_RECEIVER_TIMEOUT_SECONDS whose threads still run). Sent when a call is
#   given up, and again when such a call returns.
messages_saved = Signal()
message_processed = Signal()
delivery_failed = Signal()
message_dead_lettered = Signal()
lease_lost = Signal()
shards_claimed = Signal()
receivers_stuck = Signal()
duplicate_skipped = Signal()


def announce_saved(rows: Sequence[models.Model], using: str) -> None:
    """Send `messages_saved` for outbox rows of one table just written (the write path's
    saves and bulk inserts). The write path calls it only while `messages_saved` has a
    receiver at all, so a write pays nothing for it otherwise."""
    # `receivers` first: has_listeners looks up the live receivers even when none is
    # connected at all, the usual case, and this runs for every write.
    if rows and messages_saved.receivers and messages_saved.has_listeners(type(rows[0])):
        messages_saved.send(sender=type(rows[0]), rows=list(rows), using=using)


def receiver_id(receiver: Callable[..., Any]) -> str:
    """A receiver's stable name across processes: `module.qualname`."""
    target = getattr(receiver, "__func__", receiver)
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"
