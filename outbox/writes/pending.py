"""Shards written in a transaction, handed on once it commits.

`PendingFlush` gives them to the synchronous flush (the engine, through the flush hook);
`PendingPromptDrain` gives rows left to the drain to the OUTBOX_PROMPT_DRAIN hook, which
enqueues a drain task for them. After commit the rows are durable: a failing hook is
logged, not raised into the request, unless OUTBOX_FLUSH_STRICT.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.shards import ShardKey
from outbox.writes.hooks import hooks

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
        flush = hooks.flush
        if flush is None:  # the app is not ready (or not installed): leave it to the drain
            return
        with _logged_unless_strict("outbox.flush_failed", self.using, self.bounds):
            flush(self.using, self.bounds)


@dataclass
class PendingPromptDrain:
    """Shards written on one database and left to the drain, handed once to the
    OUTBOX_PROMPT_DRAIN hook by the first of their commit hooks."""

    using: str
    shards: dict[type[OutboxBase], set[ShardKey]] = field(default_factory=dict)
    done: bool = False

    def add(self, row: OutboxBase) -> None:
        self.shards.setdefault(type(row), set()).add(row.shard_key)

    def run(self) -> None:
        if self.done:
            return
        self.done = True
        path = outbox_settings.PROMPT_DRAIN
        if not path:
            return
        with _logged_unless_strict("outbox.prompt_drain_failed", self.using, self.shards):
            import_string(path)(self.using, self.shards)


_FAILURE_MESSAGES = {
    "outbox.flush_failed": "outbox flush failed; the rows stay for the drain",
    "outbox.prompt_drain_failed": (
        "outbox prompt drain failed; the rows stay for the periodic drain"
    ),
}


@contextmanager
def _logged_unless_strict(
    event: str, using: str, shards: Mapping[type[OutboxBase], Iterable[ShardKey]]
) -> Iterator[None]:
    """After commit the rows are durable: an error of the hook is logged, not raised
    into the request, unless OUTBOX_FLUSH_STRICT."""
    try:
        yield
    except Exception:
        if outbox_settings.FLUSH_STRICT:
            raise
        names = [str(key) for keys in shards.values() for key in keys]
        logger.exception(
            _FAILURE_MESSAGES[event], extra={"event": event, "using": using, "shards": names}
        )
