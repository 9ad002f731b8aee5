"""Workload shapes: which rows every contender drains, generated the same way for all.

Row `g` (0-based, in id order) of a shape goes to shard `g % shards`: writes arrive
interleaved across shards, as concurrent traffic would write them. Within a shard the
rows cycle through its objects, and each object is updated `updates_per_object` times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.outboxes import BenchCategory, BenchScope


@dataclass(frozen=True)
class Shape:
    """A workload: `shards` x `objects_per_shard` objects, each updated N times."""

    name: str
    title: str
    scope: BenchScope
    category: BenchCategory
    shards: int
    objects_per_shard: int
    updates_per_object: int

    @property
    def rows(self) -> int:
        return self.shards * self.objects_per_shard * self.updates_per_object

    @property
    def groups(self) -> int:
        """Distinct coalescing groups: the fewest receiver calls a coalescing drain makes."""
        return self.shards * self.objects_per_shard

    def describe(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "rows": self.rows,
            "shards": self.shards,
            "objects_per_shard": self.objects_per_shard,
            "updates_per_object": self.updates_per_object,
            "coalescing_groups": self.groups,
        }

    def messages(self) -> Iterator[dict[str, Any]]:
        """The shape's messages in id order, as receiver keyword arguments (Python twin
        of `bench.db.load_shape`'s SQL, for contenders that do not read the outbox)."""
        shards, objects = self.shards, self.objects_per_shard
        for g in range(self.rows):
            shard, position = g % shards, g // shards
            obj = shard * objects + position % objects + 1
            yield {
                "shard_scope": int(self.scope),
                "shard_identifier": shard + 1,
                "object_identifier": obj,
                "payload": {"object": obj, "version": position // objects, "name": f"o{obj}"},
            }


def audit_log(rows: int, suffix: str = "") -> Shape:
    """One message per shard: every shard is claimed, delivered and released for one row.

    `suffix` tells apart two sizes of this shape in one run (`one_per_shard_20k`)."""
    return Shape(
        f"one_per_shard{suffix}",
        f"one message per shard (audit log{', ' + suffix.strip('_') if suffix else ''})",
        BenchScope.AUDIT,
        BenchCategory.AUDIT_EVENT,
        rows,
        1,
        1,
    )


def ordered_streams(shards: int, objects_per_shard: int) -> Shape:
    """Ordered streams: many distinct objects per shard, one message each (no coalescing)."""
    return Shape(
        "ordered_streams",
        "ordered streams (shards x distinct objects)",
        BenchScope.STREAM,
        BenchCategory.STREAM_UPDATE,
        shards,
        objects_per_shard,
        1,
    )


def heavy_coalescing(objects: int, updates: int) -> Shape:
    """Heavy coalescing: each object is its own shard and is updated many times."""
    return Shape(
        "heavy_coalescing",
        "heavy coalescing (objects x updates)",
        BenchScope.OBJECT,
        BenchCategory.OBJECT_UPDATE,
        objects,
        1,
        updates,
    )
