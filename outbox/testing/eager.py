"""Eager delivery for tests, on top of the engine's `outbox.engine.eager`.

A flush that `TestCase.captureOnCommitCallbacks(execute=True)` runs inside the test's
own transaction already delivers there (the app installs that hook). `eager_delivery()`
widens it: within its block a flush delivers inside any open transaction, one the test
opened itself too, and `raise_errors=True` raises a receiver's error out of the flush.
`deliver_pending()` plays the drain for rows left to it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from django.db import router

from outbox.engine.eager import deliver_eagerly
from outbox.models import OutboxBase, outbox_models
from outbox.shards import ShardKey
from outbox.writes.context import in_transaction_flush

__all__ = ["deliver_eagerly", "deliver_pending", "eager_delivery"]


@contextmanager
def eager_delivery(*, raise_errors: bool = False) -> Iterator[None]:
    """Within this block, a flush run inside an open transaction (by
    `captureOnCommitCallbacks(execute=True)`) delivers there, even inside a transaction
    the test opened itself, instead of raising FlushInOpenTransaction.
    `raise_errors=True` also raises a receiver's error out of the flush, after
    recording it as the engine would."""

    def flush(using: str, bounds: Mapping[type[OutboxBase], Mapping[ShardKey, int | None]]) -> int:
        return deliver_eagerly(using, bounds, raise_errors=raise_errors)

    token = in_transaction_flush.set(flush)
    try:
        yield
    finally:
        in_transaction_flush.reset(token)


def deliver_pending(using: str | None = None, *, raise_errors: bool = False) -> int:
    """Deliver every pending row of every outbox table now, as `deliver_eagerly` does,
    inside the current transaction if one is open: for tests of code that leaves its
    rows to the drain (`outbox_context(flush=False)`). Each table is read on `using`,
    or on the database its router writes it to. Returns the groups delivered.
    Test-only: it takes no leases, so it must not race a real drain."""
    delivered = 0
    for model in outbox_models():
        database = using or router.db_for_write(model)
        rows = model._default_manager.using(database).pending()
        shards = {model.shard_key_of(values) for values in rows.values_list(*model.shard_fields)}
        bounds = {model: dict.fromkeys(sorted(shards))}
        delivered += deliver_eagerly(database, bounds, raise_errors=raise_errors)
    return delivered
