"""Capturing the outbox messages a test saves, and asserting on them.

`capture_outbox_messages()` listens to `outbox.signals.messages_saved`, so it sees
every row written by `save()`, `bulk_create()`, producers and the deferred writer,
whether or not it is ever delivered (flushed, left to the drain, or rolled back later).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from outbox.categories import OutboxCategory, OutboxScope, registry
from outbox.models import OutboxBase
from outbox.shards import ShardKey
from outbox.signals import messages_saved

_ANY: Any = object()


@dataclass(frozen=True)
class CapturedMessage:
    """One outbox row as it was saved. `table` is the model label ("outbox.RegionOutbox")."""

    scope: OutboxScope
    shard: ShardKey
    category: OutboxCategory
    object_identifier: int
    payload: Any
    table: str
    using: str

    @classmethod
    def of(cls, row: OutboxBase, using: str) -> CapturedMessage:
        return cls(
            scope=registry.scope(row.shard_scope),
            shard=row.shard_key,
            category=registry.category(row.category),
            object_identifier=row.object_identifier,
            payload=row.payload,
            table=row._meta.label,
            using=using,
        )


class CapturedMessages(list[CapturedMessage]):
    """The messages saved so far, in order, with assertions for tests.

    Every filter is optional: `category`, `payload`, `object_identifier`, `shard_identifier`,
    `scope`, `table` (a label, or the model class).
    """

    def sent(
        self,
        category: OutboxCategory | int | None = None,
        *,
        payload: Any = _ANY,
        object_identifier: int | None = None,
        shard_identifier: int | None = None,
        scope: OutboxScope | int | None = None,
        table: str | type[OutboxBase] | None = None,
    ) -> list[CapturedMessage]:
        """The captured messages matching every filter given."""
        label = table._meta.label if isinstance(table, type) else table
        return [
            message
            for message in self
            if (category is None or message.category == category)
            and (payload is _ANY or message.payload == payload)
            and (object_identifier is None or message.object_identifier == object_identifier)
            and (shard_identifier is None or message.shard.shard_identifier == shard_identifier)
            and (scope is None or message.scope == scope)
            and (label is None or message.table == label)
        ]

    def assert_sent(
        self, category: OutboxCategory | int | None = None, **filters: Any
    ) -> list[CapturedMessage]:
        """Assert that at least one message matches; return the matches."""
        matches = self.sent(category, **filters)
        if not matches:
            raise AssertionError(self._explain("no outbox message", category, filters))
        return matches

    def assert_sent_once(
        self, category: OutboxCategory | int | None = None, **filters: Any
    ) -> CapturedMessage:
        """Assert that exactly one message matches; return it."""
        matches = self.sent(category, **filters)
        if len(matches) != 1:
            found = f"{len(matches)} outbox messages, not one,"
            raise AssertionError(self._explain(found, category, filters))
        return matches[0]

    def assert_not_sent(self, category: OutboxCategory | int | None = None, **filters: Any) -> None:
        """Assert that no message matches."""
        if self.sent(category, **filters):
            raise AssertionError(self._explain("unexpected outbox messages", category, filters))

    def assert_nothing_sent(self) -> None:
        """Assert that no outbox message was saved at all."""
        if self:
            raise AssertionError(f"expected no outbox message, saved: {self._listing()}")

    def _explain(self, found: str, category: Any, filters: dict[str, Any]) -> str:
        wanted = {"category": category, **filters} if category is not None else filters
        described = ", ".join(f"{name}={value!r}" for name, value in wanted.items())
        return f"{found} matching {described or 'anything'}; saved: {self._listing()}"

    def _listing(self) -> str:
        if not self:
            return "none"
        return "; ".join(
            f"{m.table} {m.category.name} shard {m.shard} object {m.object_identifier} "
            f"payload {m.payload!r}"
            for m in self
        )


@contextmanager
def capture_outbox_messages() -> Iterator[CapturedMessages]:
    """Record the outbox messages saved inside the block (any table, any database)."""
    captured = CapturedMessages()

    def record(sender: type[OutboxBase], rows: list[OutboxBase], using: str, **_: Any) -> None:
        captured.extend(CapturedMessage.of(row, using) for row in rows)

    messages_saved.connect(record, weak=False, dispatch_uid=("outbox.testing", id(captured)))
    try:
        yield captured
    finally:
        messages_saved.disconnect(dispatch_uid=("outbox.testing", id(captured)))
