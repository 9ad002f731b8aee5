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

`in_transaction_flush` is set only by `outbox.testing.eager_delivery()`: the flush to
run inside any open transaction, instead of refusing where the test opened one itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol, cast

from django.apps import apps

from outbox.cursors import CommitWithInsert
from outbox.shards import ShardKey

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
