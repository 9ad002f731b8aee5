"""Shards written in a transaction, handed on once it commits.

`PendingFlush` gives them to the synchronous flush (the engine, through the flush hook);
`PendingPromptDrain` gives rows left to the drain to the OUTBOX_PROMPT_DRAIN hook, which
enqueues a drain task for them. After commit the rows are durable: a failing hook is
logged, not raised into the request, unless OUTBOX_FLUSH_STRICT.

A flush that finds its transaction still open was run early by test machinery
(`TestCase.captureOnCommitCallbacks(execute=True)`). Where only `TestCase`'s own
transactions are open, the code under test has left all of its own, so a real commit
would have run the flush there: it delivers eagerly, in the test's transaction (the
engine's hook). Inside a transaction the test opened itself it delivers only where
`outbox.testing.eager_delivery()` asked for that, and raises FlushInOpenTransaction
otherwise, so that a test never passes with nothing delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import connections
from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.exceptions import FlushInOpenTransaction
from outbox.shards import ShardKey
from outbox.writes.hooks import LayersAbove, in_transaction_flush, layers_above

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
        above = layers_above()
        if above is None:  # the app is not loaded yet: leave it to the drain
            return
        if connections[self.using].in_atomic_block:
            self._run_in_open_transaction(above)
            return
        with _logged_unless_strict("outbox.flush_failed", self.using, self.bounds):
            above.flush(self.using, self.bounds)

    def _run_in_open_transaction(self, above: LayersAbove) -> None:
        """On_commit callbacks running before the commit: only test machinery does
        that. Deliver in the open transaction where nothing but TestCase's own
        transactions are open, or where the test asked for it; never pass silently."""
        eager = in_transaction_flush.get()
        if eager is None and _only_test_case_transactions(self.using):
            eager = above.flush_in_test_transaction
        if eager is not None:
            eager(self.using, self.bounds)
            return
        shards = ", ".join(str(key) for keys in self.bounds.values() for key in keys)
        raise FlushInOpenTransaction(
            f"The outbox flush of shards {shards} ran inside a transaction still open on "
            f"{self.using!r}, so nothing was delivered: on_commit callbacks ran before "
            "its commit, as TestCase.captureOnCommitCallbacks(execute=True) does when it "
            "ends inside a transaction.atomic() block the test opened. End the capture "
            "outside that block (the flush then delivers inside TestCase's own "
            "transaction), or deliver inside it with outbox.testing.eager_delivery() "
            "(pytest fixture `outbox_eager`, or OutboxTestMixin); to commit for real, "
            "use TransactionTestCase or pytest.mark.django_db(transaction=True)."
        )


def _only_test_case_transactions(using: str) -> bool:
    """True when every atomic block open on `using` is one that django.test.TestCase
    opened around its class or test (Django marks them `_from_testcase`, and lets a
    durable block open inside them for the same reason): the code under test has
    left all of its own transactions, so outside a test it would have committed."""
    blocks = connections[using].atomic_blocks
    return bool(blocks) and all(getattr(block, "_from_testcase", False) for block in blocks)


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
