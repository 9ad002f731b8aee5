"""`outbox_context`: which outbox writes are flushed right after commit.

The state lives in a ContextVar, so threads and asyncio tasks never see each other's.
Rows tell this module which shards they wrote (`record_writes`); when flushing is on,
the shards are handed to the engine by an on_commit hook of the row's own database.
The engine is imported lazily: the write path sits below it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.transaction import Atomic

from outbox.conf import outbox_settings
from outbox.exceptions import OutboxContextRequired, OutboxError
from outbox.shards import ShardKey

if TYPE_CHECKING:
    from outbox.models import OutboxBase

logger = logging.getLogger("outbox.flush")


@dataclass
class PendingFlush:
    """Shards written on one database, flushed once by the first of its commit hooks.

    `bounds` holds, per outbox model and shard, the highest row id written: the flush
    stops there, so a busy shard cannot keep the request flushing forever.
    """

    using: str
    bounds: dict[type[OutboxBase], dict[ShardKey, int | None]] = field(default_factory=dict)
    done: bool = False

    def add(self, row: OutboxBase) -> None:
        shards = self.bounds.setdefault(type(row), {})
        key = row.shard_key
        known = shards.get(key, 0)
        shards[key] = None if row.pk is None or known is None else max(known, row.pk)

    def run(self) -> None:
        if self.done:
            return
        self.done = True
        from outbox.engine import flush_shards

        try:
            flush_shards(self.using, self.bounds)
        except Exception:
            if outbox_settings.FLUSH_STRICT:
                raise
            shards = [str(key) for shards in self.bounds.values() for key in shards]
            logger.exception(
                "outbox flush failed; the rows stay for the drain",
                extra={"event": "outbox.flush_failed", "using": self.using, "shards": shards},
            )


@dataclass
class _Frame:
    flush: bool
    has_transaction: bool
    # Shared by nested frames: one pending flush per database, until it runs.
    pending: dict[str, PendingFlush]


_current: ContextVar[_Frame | None] = ContextVar("outbox_context", default=None)


@contextmanager
def outbox_context(
    transaction: Atomic | None = None, flush: bool | None = None
) -> Iterator[Atomic | None]:
    """Group outbox writes; flush their shards right after `transaction` commits.

    `flush=None` inherits the enclosing context's choice (True at the outermost level);
    `flush=False` leaves the rows to the drain. Flushing needs a transaction, given here
    or by an enclosing context. A rolled-back transaction flushes nothing.
    """
    outer = _current.get()
    if flush is None:
        flush = outer.flush if outer is not None else True
    has_transaction = transaction is not None or (outer is not None and outer.has_transaction)
    if flush and not has_transaction:
        raise OutboxError(
            "outbox_context(flush=True) needs a transaction: pass "
            "transaction.atomic(using=...) or flush=False."
        )
    frame = _Frame(flush, has_transaction, outer.pending if outer is not None else {})
    token = _current.set(frame)
    try:
        if transaction is None:
            yield None
        else:
            with transaction:
                yield transaction
    finally:
        _current.reset(token)


def require_context() -> None:
    """Raise if OUTBOX_REQUIRE_CONTEXT is on and no outbox_context is active."""
    if outbox_settings.REQUIRE_CONTEXT and _current.get() is None:
        raise OutboxContextRequired(
            "Outbox rows must be saved inside outbox_context() (OUTBOX_REQUIRE_CONTEXT is on)."
        )


def record_writes(using: str, rows: Sequence[OutboxBase]) -> None:
    """Remember written shards so the current context flushes them after commit."""
    frame = _current.get()
    if frame is None or not frame.flush or not rows:
        return
    pending = frame.pending.get(using)
    if pending is None or pending.done:
        pending = frame.pending[using] = PendingFlush(using)
    for row in rows:
        pending.add(row)
    # One hook per write, all running the same flush once: a hook registered inside a
    # savepoint that rolls back is dropped, and the others still flush.
    transaction.on_commit(pending.run, using=using)
