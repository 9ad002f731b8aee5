"""What the write path asks of the layers above it without importing them. The app config
(`outbox.apps.OutboxConfig`, where the layers are wired) answers, found in Django's app
registry (`layers_above`):

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

`announce_saved` tells the receivers of `messages_saved` (metrics, tracing) what was
just written; free while none is connected.

`in_transaction_flush` is set only by `outbox.testing.eager_delivery()`: the flush to
run inside any open transaction, instead of refusing where the test opened one itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol, cast

from django.apps import apps

from outbox.cursors import CommitWithInsert
from outbox.shards import ShardKey
from outbox.signals import messages_saved

if TYPE_CHECKING:
    from outbox.models import OutboxBase

FlushBounds = Mapping["type[OutboxBase]", Mapping[ShardKey, "int | None"]]


class LayersAbove(Protocol):
    """What `OutboxConfig` provides the write path with."""

    def flush(self, using: str, bounds: FlushBounds) -> object: ...

    def commit_with_last_insert(self, using: str) -> CommitWithInsert | None: ...

    def flush_in_test_transaction(self, using: str, bounds: FlushBounds) -> object: ...


def layers_above() -> LayersAbove | None:
    """The app config, or None before the app registry has loaded it (rows written then
    are left to the drain)."""
    if not apps.apps_ready:
        return None
    return cast(LayersAbove, apps.get_app_config("outbox"))


# A ContextVar: turning eager delivery on in one test (thread,
# asyncio task) never changes what another one does.
in_transaction_flush: ContextVar[Callable[[str, FlushBounds], object] | None] = ContextVar(
    "outbox_in_transaction_flush", default=None
)


def announce_saved(rows: Sequence[OutboxBase], using: str) -> None:
    """Send `messages_saved` for rows of one table just written; free without receivers."""
    # `receivers` first: has_listeners looks up the live receivers even when none is
    # connected at all, the usual case, and this runs for every write.
    if rows and messages_saved.receivers and messages_saved.has_listeners(type(rows[0])):
        messages_saved.send(sender=type(rows[0]), rows=list(rows), using=using)
