"""The engine's view of a database: one small interface, one implementation per path.

Every method runs as its own short transaction (the engine never calls them inside a
caller's transaction), so a lease is committed, and so visible to other workers, the
moment `claim` returns. "Held" always means: the lease row still carries our token.
Stealing an expired lease replaces the token in one guarded UPDATE, so a token match is
all a holder needs to check.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.models import OutboxBase
from outbox.shards import ShardKey


@dataclass
class Lease:
    """A claim on some shards of one outbox table, shared by one batch."""

    token: str
    holder: str
    seconds: float
    shards: list[ShardKey] = field(default_factory=list)


class Message:
    """The newest row of a group as the fast path reads it: only what the signal needs."""

    __slots__ = (
        "category",
        "date_added",
        "id",
        "object_identifier",
        "payload",
        "region_name",
        "scheduled_for",
        "shard_identifier",
        "shard_scope",
    )

    def __init__(self, group: Group, payload: Any, date_added: Any, scheduled_for: Any) -> None:
        self.id = group.newest_id
        self.region_name, self.shard_scope, self.shard_identifier = group.shard
        self.category = group.category
        self.object_identifier = group.object_identifier
        self.payload = payload
        self.date_added = date_added
        self.scheduled_for = scheduled_for


class Group:
    """A coalescing group as read: all its pending row ids, and its newest row.

    A plain class with slots: the engine makes one per group read, on the hot path.
    """

    __slots__ = ("attempts", "category", "message", "object_identifier", "row_ids", "shard")

    def __init__(self, shard: ShardKey, category: int, object_identifier: int) -> None:
        self.shard = shard
        self.category = category
        self.object_identifier = object_identifier
        self.row_ids: list[int] = []
        self.attempts: list[int] = []
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


@dataclass
class FailedGroup:
    """A group whose receiver raised: per-row delays, and the shard's back-off."""

    shard: ShardKey
    row_delays: dict[int, float]
    error: str
    block_seconds: float


class OutboxBackend(ABC):
    """Database operations of the engine for one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using

    @abstractmethod
    def find_due_shards(
        self,
        model: type[OutboxBase],
        limit: int,
        *,
        within: Sequence[ShardKey] | None = None,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
    ) -> list[ShardKey]:
        """Shards with a due row and no live lease, oldest work first."""

    @abstractmethod
    def claim(self, model: type[OutboxBase], shards: Sequence[ShardKey], lease: Lease) -> None:
        """Lease whichever of `shards` are free; set `lease.shards` to those won."""

    def claim_due(
        self,
        model: type[OutboxBase],
        lease: Lease,
        limit: int,
        *,
        within: Sequence[ShardKey] | None = None,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
        after: ShardKey | None = None,
    ) -> None:
        """Lease up to `limit` due, free shards; set `lease.shards` to those won.

        `after` is a hint for fairness: a backend that walks shards in key order starts
        after it and wraps around.
        """
        due = self.find_due_shards(
            model, limit, within=within, scopes=scopes, identifiers=identifiers
        )
        self.claim(model, due, lease)

    @abstractmethod
    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        """Push the lease's expiry forward; return the shards still held."""

    @abstractmethod
    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
    ) -> Window:
        """Read up to `limit` pending rows of `shards` (their first rows), coalesced."""

    @abstractmethod
    def retire(
        self, model: type[OutboxBase], lease: Lease, row_ids: Mapping[ShardKey, Sequence[int]]
    ) -> tuple[int, set[ShardKey]]:
        """Delete delivered rows of shards still held; return (deleted, shards lost)."""

    @abstractmethod
    def reschedule(
        self, model: type[OutboxBase], lease: Lease, failures: Sequence[FailedGroup]
    ) -> None:
        """Record a failed attempt on each row and back its shard off."""

    @abstractmethod
    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        """Give up the lease on `shards` (only where it is still ours)."""

    def settle(
        self,
        model: type[OutboxBase],
        lease: Lease,
        row_ids: Mapping[ShardKey, Sequence[int]],
        failures: Sequence[FailedGroup],
        release: Sequence[ShardKey],
    ) -> tuple[int, set[ShardKey]]:
        """End a round: retire delivered rows, reschedule failures, release finished shards.

        `release` never names a failed shard (rescheduling keeps its lease row as a
        back-off). Returns (rows deleted, shards whose lease was lost).
        """
        deleted, lost = self.retire(model, lease, row_ids)
        self.reschedule(model, lease, [f for f in failures if f.shard not in lost])
        self.release(model, lease, release)
        return deleted, lost


def coalesce(
    model: type[OutboxBase], rows: Sequence[Sequence[Any]]
) -> tuple[dict[ShardKey, list[Group]], dict[Group, Sequence[Any]], dict[ShardKey, int]]:
    """Group rows read in id order (within each shard) into coalescing groups.

    Each row is the `shard_fields` values, then id, category, object_identifier and
    attempts, then whatever else the caller read. Returns the groups per shard (in order
    of their oldest row), each group's newest row, and the number of rows per shard.
    This loop runs once per row read, so it is kept tight.
    """
    width = len(model.shard_fields)
    groups: dict[ShardKey, list[Group]] = {}
    newest: dict[Group, Sequence[Any]] = {}
    read: dict[ShardKey, int] = {}
    per_shard: dict[tuple[Any, ...], tuple[ShardKey, list[Group], dict[tuple[int, int], Group]]]
    per_shard = {}
    last_raw: tuple[Any, ...] = ()
    shard = ShardKey("", 0, 0)
    shard_groups: list[Group] = []
    by_object: dict[tuple[int, int], Group] = {}
    for row in rows:
        raw = tuple(row[:width])
        if raw != last_raw:  # rows of one shard usually come together
            last_raw = raw
            if raw not in per_shard:
                key = model.shard_key_of(raw)
                per_shard[raw] = (key, groups.setdefault(key, []), {})
                read[key] = 0
            shard, shard_groups, by_object = per_shard[raw]
        read[shard] += 1
        object_key = (row[width + 1], row[width + 2])
        group = by_object.get(object_key)
        if group is None:
            group = by_object[object_key] = Group(shard, *object_key)
            shard_groups.append(group)
        group.row_ids.append(row[width])
        group.attempts.append(row[width + 3])
        newest[group] = row  # the last row seen of a group is its newest
    return groups, newest, read
