"""What the engine and a backend hand each other: a lease, the filter of a claim, the
window read (its groups and their newest messages) and the settlement of a round, with
what it did. Plain values: no database access here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.models import OutboxBase
from outbox.shards import ShardKey


@dataclass
class Lease:
    """A claim on some shards of one outbox table, shared by one batch.

    `seconds` is the lease length (each renewal extends it by that much from now on the
    database clock); `shards` are the shards the claim won and still works on.
    """

    token: str
    holder: str
    seconds: float
    shards: list[ShardKey] = field(default_factory=list)


@dataclass(frozen=True)
class ShardFilter:
    """Which shards a claim may take. Empty means any due shard of the table.

    `shards` limits the claim to these shards; `scopes` and `identifiers` to shards of
    those scopes or identifiers. `after` is a fairness hint, not a filter: a backend
    that walks shards in key order starts after it and wraps around. `small` is a hint
    too: the last batch was full and its shards held about one row each, so a backend
    may look for due shards by scanning rows rather than skipping from shard to shard.
    """

    shards: tuple[ShardKey, ...] | None = None
    scopes: tuple[int, ...] | None = None
    identifiers: tuple[int, ...] | None = None
    after: ShardKey | None = None
    small: bool = False


class Message:
    """The newest row of a group as a fast path reads it: only what the signal needs.

    A backend may instead hand the engine the model instance itself; both carry the
    shard fields, `category`, `object_identifier`, `attempts`, `message_id`, `headers`,
    a decoded `payload` and the times.
    """

    __slots__ = (
        "attempts",
        "category",
        "date_added",
        "delivered_to",
        "headers",
        "id",
        "message_id",
        "object_identifier",
        "payload",
        "region_name",
        "scheduled_for",
        "shard_identifier",
        "shard_scope",
    )

    def __init__(
        self,
        group: Group,
        payload: Any,
        date_added: Any,
        scheduled_for: Any,
        delivered_to: str = "",
        message_id: Any = None,
        headers: Any = None,
    ) -> None:
        self.id = group.row_ids[-1]  # the newest
        self.attempts = group.attempts[-1]
        self.region_name, self.shard_scope, self.shard_identifier = group.shard
        self.category = group.category
        self.object_identifier = group.object_identifier
        self.payload = payload
        self.date_added = date_added
        self.scheduled_for = scheduled_for
        self.delivered_to = delivered_to
        self.message_id = message_id
        self.headers = headers


class Group:
    """A coalescing group as read: its pending row ids (oldest first), their attempts,
    and its newest row (`message`; None when an operator removed it meanwhile).

    A plain class with slots: the engine makes one per group read, on the hot path.
    """

    __slots__ = ("attempts", "category", "message", "object_identifier", "row_ids", "shard")

    def __init__(
        self, shard: ShardKey, category: int, object_identifier: int, row_id: int, attempts: int
    ) -> None:
        """A group as its first (oldest) row is read: that row's id and attempts."""
        self.shard = shard
        self.category = category
        self.object_identifier = object_identifier
        self.row_ids: list[int] = [row_id]
        self.attempts: list[int] = [attempts]
        self.message: OutboxBase | Message | None = None

    @property
    def newest_id(self) -> int:
        return self.row_ids[-1]


@dataclass
class Window:
    """One read of the claimed shards: groups per shard in order of their oldest row.

    `incomplete` names the shards that may have more rows than were read; the others
    were read to their end (as far as this read could see).
    """

    shards: dict[ShardKey, list[Group]]
    incomplete: set[ShardKey]


@dataclass(frozen=True)
class FailedGroup:
    """A group whose receiver raised: when to retry each row, the error, and how long
    its shard backs off (the delay of the shard's head row).

    `traceback` is the formatted traceback; `delivered_to` (JSON text, "" for none) lists
    the receivers that succeeded for the group's newest row (the highest id in
    `row_delays`), written on that row only. As a dead group, the delays are unused.
    """

    shard: ShardKey
    row_delays: dict[int, float]
    error: str
    block_seconds: float
    traceback: str = ""
    delivered_to: str = ""
    asked_later: bool = False  # every receiver that failed raised RetryLater


@dataclass(frozen=True)
class Settlement:
    """The end of a round, for one lease.

    - `delivered`: per shard, the row ids whose receivers succeeded: delete them;
    - `failed`: groups to reschedule; their shards keep a lease row without a holder
      until the back-off ends, so their later groups wait in order;
    - `release`: finished shards whose lease to drop (never a failed shard);
    - `dead`: groups to move to the dead-letter state: their rows are kept with
      `dead_at` set, the attempt recorded as for a failure, and are never read or
      claimed again; their shard goes on (release it, or keep delivering).
    """

    delivered: Mapping[ShardKey, Sequence[int]] = field(default_factory=dict)
    failed: Sequence[FailedGroup] = ()
    release: Sequence[ShardKey] = ()
    dead: Sequence[FailedGroup] = ()


@dataclass(frozen=True)
class HeldLeases:
    """Leases other claims hold (`OutboxBackend.held_by_others`): how many, and the
    latest claim among them (None when there are none)."""

    count: int
    latest: datetime | None


@dataclass(frozen=True)
class SettleResult:
    """What a settlement did: rows deleted, and the shards whose lease was lost (their
    rows were neither deleted nor rescheduled; another worker delivers them again)."""

    deleted: int = 0
    lost: frozenset[ShardKey] = frozenset()
