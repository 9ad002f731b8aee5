"""The message a relay forwards: one delivered outbox message, with its shard as a key and
the headers every relay sends."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from outbox.categories import OutboxCategory, OutboxScope
from outbox.headers import writer_headers

__all__ = ["Message"]


@dataclass(frozen=True)
class Message:
    """One delivered outbox message, as a relay forwards it."""

    message_id: uuid.UUID
    category: OutboxCategory
    scope: OutboxScope
    shard_identifier: int
    object_identifier: int
    payload: Any
    attempt: int = 1
    headers: Mapping[str, str] = field(default_factory=dict)
    region_name: str | None = None
    using: str = "default"

    @classmethod
    def from_receiver(cls, sender: OutboxCategory, kwargs: Mapping[str, Any]) -> Message:
        """The message a process signal sends its receivers (`sender` and their kwargs)."""
        return cls(
            message_id=_as_uuid(kwargs["message_id"]),
            category=sender,
            scope=sender.scope,
            shard_identifier=kwargs["shard_identifier"],
            object_identifier=kwargs["object_identifier"],
            payload=kwargs["payload"],
            attempt=kwargs.get("attempt") or 1,
            headers=dict(kwargs.get("headers") or {}),
            region_name=kwargs.get("region_name"),
            using=kwargs.get("using", "default"),
        )

    @cached_property  # read several times per publish (waves, headers, a key)
    def shard_key(self) -> str:
        """The shard as one string, the same for every message of the shard:
        ``SCOPE:identifier`` (``:region`` added for a control outbox). Brokers that
        partition by key keep a shard in one partition, so in order."""
        key = f"{self.scope.name}:{self.shard_identifier}"
        return f"{key}:{self.region_name}" if self.region_name else key

    @property
    def time(self) -> datetime:
        """When the message was written: read from its id (a version 7 UUID carries its
        millisecond), or now for an id the database made (a random one)."""
        if self.message_id.version == 7:
            return datetime.fromtimestamp((self.message_id.int >> 80) / 1000, tz=timezone.utc)
        return datetime.now(tz=timezone.utc)

    def relay_headers(self) -> dict[str, str]:
        """The headers every relay sends, whatever the envelope: the message id, its
        category, shard and attempt, then the writer's headers (trace context among
        them: ``traceparent``, ``tracestate``) but those `outbox.headers` reserves,
        which a row written before the rule may hold."""
        return {
            "outbox-message-id": str(self.message_id),
            "outbox-category": self.category.name,
            "outbox-shard": self.shard_key,
            "outbox-attempt": str(self.attempt),
            **writer_headers(self.headers),
        }


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
