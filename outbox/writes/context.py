"""`outbox_context`: which outbox writes are flushed right after commit, and what is
handed on at commit.

The state lives in a ContextVar, so threads and asyncio tasks never see each other's.
The write path of outbox tables (`ContextWritePath`, below) records which shards a save
wrote (`record_writes`);
when flushing is on, the shards are handed to the flush by an on_commit callback of the
row's own database. When it is off, and OUTBOX_PROMPT_DRAIN names a hook, the shards are
handed to that hook at commit instead (to enqueue a drain task for them), so they need
not wait for the next periodic drain.

What the write path asks of the layers above
--------------------------------------------
The write path never imports the engine or the backends. The app config
(`outbox.apps.OutboxConfig.ready`, where the layers are wired) installs what it needs
of them (`install`, `LayersAbove`); until then rows written are left to the drain:

- `flush(using, bounds)`: deliver the shards a committed transaction wrote, up to
  their bounds (the engine's synchronous flush).
- `commit_with_last_insert(using)`: an execute wrapper that sends the COMMIT in the
  same round trip as the deferred writer's last INSERT, with the cursor that INSERT
  runs on (`outbox.cursors.CommitWithInsert`), or None where the database cannot (an
  optional capability of a backend: PostgreSQL's).
- `flush_in_test_transaction(using, bounds)`: deliver them inside the open transaction
  when on_commit callbacks run while only `django.test.TestCase`'s own transactions
  are open, as `captureOnCommitCallbacks(execute=True)` runs them (the engine's eager
  delivery).

`in_transaction_flush` is set only by `outbox.testing.eager_delivery()`: the flush to
run inside any open transaction, instead of refusing where the test opened one itself.

What is handed on at commit
---------------------------
Shards written in a transaction, handed on once it commits.

`PendingFlush` gives them to the synchronous flush (the engine's, as installed);
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, TypeVar, cast

from django.db import connections, models, transaction
from django.db.transaction import Atomic
from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.cursors import CommitWithInsert
from outbox.exceptions import FlushInOpenTransaction, OutboxContextRequired, OutboxError
from outbox.shards import ShardKey
from outbox.signals import announce_saved, messages_saved
from outbox.writes.deferred import HeldRows, held_rows_for

if TYPE_CHECKING:  # imported at runtime only once the app is ready (`install`)
    from outbox.models import OutboxBase

FlushBounds = Mapping["type[OutboxBase]", Mapping[ShardKey, "int | None"]]


# --- What the write path asks of the layers above -----------------------------------


@dataclass(frozen=True)
class LayersAbove:
    """What `OutboxConfig.ready` gives the write path: the engine's flush and eager
    delivery, the backends' COMMIT with the last INSERT."""

    flush: Callable[[str, FlushBounds], object]
    commit_with_last_insert: Callable[[str], CommitWithInsert | None]
    flush_in_test_transaction: Callable[[str, FlushBounds], object]


_above: LayersAbove | None = None


def install(above: LayersAbove) -> None:
    """Route the saves of every outbox table through `ContextWritePath`, and give it
    the layers above (`OutboxConfig.ready`)."""
    from outbox.models import OutboxBase

    global _above
    _above = above
    OutboxBase.write_path = ContextWritePath()


def layers_above() -> LayersAbove | None:
    """What `install` gave, or None before the app is ready (rows written then are left
    to the drain)."""
    return _above


# A ContextVar: turning eager delivery on in one test (thread,
# asyncio task) never changes what another one does.
in_transaction_flush: ContextVar[Callable[[str, FlushBounds], object] | None] = ContextVar(
    "outbox_in_transaction_flush", default=None
)


# --- What is handed on at commit ------------------------------------------------

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


# --- outbox_context ----------------------------------------------------------------


@dataclass
class _Frame:
    flush: bool
    has_transaction: bool
    # Shared by nested frames: one pending flush per database, until it runs.
    pending: dict[str, PendingFlush]
    # Likewise for rows left to the drain, when OUTBOX_PROMPT_DRAIN is set.
    prompt: dict[str, PendingPromptDrain] = field(default_factory=dict)
    # Rows held until commit, per database whose outermost transaction a frame owns.
    held: dict[str, HeldRows] = field(default_factory=dict)


_current: ContextVar[_Frame | None] = ContextVar("outbox_context", default=None)


@contextmanager
def outbox_context(
    transaction: Atomic | None = None,
    flush: bool | None = None,
    *,
    defer: bool | None = None,
) -> Iterator[Atomic | None]:
    """Group outbox writes; flush their shards right after `transaction` commits.

    `flush=None` inherits the enclosing context's choice (at the outermost level,
    OUTBOX_FLUSH, True by default); `flush=False` leaves the rows to the drain. Flushing
    needs a transaction, given here or by an enclosing context. A rolled-back
    transaction flushes nothing.

    `defer=True` (default: OUTBOX_DEFER_WRITES) holds the outbox rows saved in the block
    and writes them with one bulk insert as it commits, where this context opens the
    outermost transaction (see `outbox.writes.deferred`); otherwise every save INSERTs
    at once, as `Model.save` does.
    """
    frame = _new_frame(_current.get(), transaction, flush)
    if defer is None:
        defer = outbox_settings.DEFER_WRITES
    # The deferred writer is opt-in: without it, nothing of it runs.
    held = held_rows_for(transaction, defer) if defer else None
    if held is not None:
        frame.held[held.using] = held
    token = _current.set(frame)
    try:
        if transaction is None:
            yield None
        else:
            with transaction:
                yield transaction
                if held is not None:
                    # Gone before the commit hooks run, so their writes are not held.
                    del frame.held[held.using]
                    above = layers_above()
                    commit_wrapper = (
                        above.commit_with_last_insert(held.using) if above is not None else None
                    )
                    for row_frame, rows in _by_frame(held.write(commit_wrapper)):
                        _record(row_frame, held.using, rows)
    finally:
        if held is not None:
            held.discard()
            frame.held.pop(held.using, None)
        _current.reset(token)


def _new_frame(outer: _Frame | None, transaction: Atomic | None, flush: bool | None) -> _Frame:
    """A frame inside `outer` (if any), sharing its pending work."""
    if flush is None:
        flush = outer.flush if outer is not None else outbox_settings.FLUSH
    has_transaction = transaction is not None or (outer is not None and outer.has_transaction)
    if flush and not has_transaction:
        raise OutboxError(
            "outbox_context(flush=True) (the default with OUTBOX_FLUSH on) needs a "
            "transaction: pass transaction.atomic(using=...) or flush=False."
        )
    return _Frame(
        flush,
        has_transaction,
        outer.pending if outer is not None else {},
        outer.prompt if outer is not None else {},
        outer.held if outer is not None else {},
    )


def hold(rows: Sequence[OutboxBase], payloads: Sequence[str], using: str, *, saved: bool) -> bool:
    """Hold rows until the commit of the transaction an outbox_context owns on `using`
    (see outbox.writes.deferred); False when there is none and the caller INSERTs them
    now."""
    frame = _current.get()
    held = frame.held.get(using) if frame is not None else None
    if held is None or not held.can_hold():
        return False
    held.hold(rows, payloads, frame, saved=saved)
    return True


def _by_frame(kept: list[tuple[OutboxBase, _Frame]]) -> Iterator[tuple[_Frame, list[OutboxBase]]]:
    for _, group in groupby(kept, key=lambda item: id(item[1])):
        entries = list(group)
        yield entries[0][1], [row for row, _ in entries]


def require_context() -> None:
    """Raise if OUTBOX_REQUIRE_CONTEXT is on and no outbox_context is active."""
    if outbox_settings.REQUIRE_CONTEXT and _current.get() is None:
        raise OutboxContextRequired(
            "Outbox rows must be saved inside outbox_context() (OUTBOX_REQUIRE_CONTEXT is on)."
        )


def record_writes(using: str, rows: Sequence[OutboxBase]) -> None:
    """Remember written shards so the current context flushes them after commit."""
    _record(_current.get(), using, rows)


def _record(frame: _Frame | None, using: str, rows: Sequence[OutboxBase]) -> None:
    if not rows:
        return
    if frame is None or not frame.flush:
        if outbox_settings.PROMPT_DRAIN:
            _record_for_prompt_drain(frame, using, rows)
        return
    pending = frame.pending.get(using)
    if pending is None or pending.done:
        pending = frame.pending[using] = PendingFlush(using)
    for row in rows:
        pending.add(row)
    # One hook per write, all running the same flush once: a hook registered inside a
    # savepoint that rolls back is dropped, and the others still flush.
    transaction.on_commit(pending.run, using=using)


def _record_for_prompt_drain(frame: _Frame | None, using: str, rows: Sequence[OutboxBase]) -> None:
    # Outside any outbox_context each write gets its own hook; inside one, the writes of
    # a transaction share one, like the flush above.
    pending = frame.prompt.get(using) if frame is not None else None
    if pending is None or pending.done:
        pending = PendingPromptDrain(using)
        if frame is not None:
            frame.prompt[using] = pending
    for row in rows:
        pending.add(row)
    transaction.on_commit(pending.run, using=using)


# --- The write path of outbox tables ---------------------------------------------------
#
# By default a row saved in `outbox_context` behaves like `Model.save`: it is INSERTed at
# `save()` by Django itself, gets its primary key, sends `pre_save` and `post_save` in
# order and is visible to the transaction's own queries. Its shard is then recorded for
# the flush after commit. Rows are held until the commit instead only where the deferred
# writer is on (`outbox.writes.deferred`).

_Row = TypeVar("_Row", bound=models.Model)


class ContextWritePath:
    """The `outbox.models.WritePath` that `install` puts on `OutboxBase.write_path`."""

    def save(
        self,
        row: models.Model,
        using: str,
        payload_json: str,
        save_now: Callable[[], None],
        can_hold: bool,
    ) -> None:
        # Only outbox rows come here (`WritePath` names them as models, below them).
        rows = [cast("OutboxBase", row)]
        require_context()
        if can_hold and hold(rows, [payload_json], using, saved=True):
            return  # written at the commit of the enclosing outbox_context
        save_now()
        record_writes(using, rows)
        if messages_saved.receivers:  # no call at all while nothing listens
            announce_saved(rows, using)

    def bulk_create(
        self,
        rows: list[_Row],
        using: str,
        payloads_json: list[str],
        create_now: Callable[[], list[_Row]],
        can_hold: bool,
    ) -> list[_Row]:
        require_context()
        if can_hold and hold(cast("list[OutboxBase]", rows), payloads_json, using, saved=False):
            return rows  # written at the commit of the enclosing outbox_context
        created = create_now()
        record_writes(using, cast("list[OutboxBase]", created))
        if messages_saved.receivers:
            announce_saved(created, using)
        return created
