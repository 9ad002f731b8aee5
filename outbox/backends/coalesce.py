"""Coalescing rows into groups: pure Python, shared by every backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.backends.base import Group
from outbox.models import OutboxBase
from outbox.shards import ShardKey

Coalesced = tuple[
    dict[ShardKey, list[Group]], dict[Group, Sequence[Any]], dict[ShardKey, int], set[ShardKey]
]


def coalesce(
    model: type[OutboxBase],
    rows: Sequence[tuple[Any, ...]],
    shards: Sequence[ShardKey] = (),
) -> Coalesced:
    """Group rows read in id order (within each shard) into coalescing groups.

    Each row is the `shard_fields` values, then id, category, object_identifier,
    attempts and whether the row is due, then whatever else the caller read. A shard
    stops at its first row that is not due: that row and the shard's later rows wait
    (the shard is "cut"). Returns the groups per shard (in order of their oldest row),
    each group's newest row, the number of rows read per shard, and the shards cut.
    The loop runs once per row read, so it is kept tight (keys of `shards` are reused).
    """
    width = len(model.shard_fields)
    known = {key[3 - width :]: key for key in shards}
    groups: dict[ShardKey, list[Group]] = {}
    newest: dict[Group, Sequence[Any]] = {}
    read: dict[ShardKey, int] = {}
    cut: set[ShardKey] = set()
    per_shard: dict[tuple[Any, ...], tuple[ShardKey, list[Group], dict[tuple[int, int], Group]]]
    per_shard = {}
    last_raw: tuple[Any, ...] = ()
    shard = ShardKey("", 0, 0)
    shard_groups: list[Group] = []
    by_object: dict[tuple[int, int], Group] = {}
    for row in rows:
        raw = row[:width]  # rows are tuples (as the drivers and values_list give them)
        if raw != last_raw:  # rows of one shard usually come together
            last_raw = raw
            if raw not in per_shard:
                key = known.get(raw) or model.shard_key_of(raw)
                per_shard[raw] = (key, groups.setdefault(key, []), {})
                read[key] = 0
            shard, shard_groups, by_object = per_shard[raw]
        read[shard] += 1
        if not row[width + 4] or shard in cut:
            cut.add(shard)
            continue
        object_key = (row[width + 1], row[width + 2])
        group = by_object.get(object_key)
        if group is None:
            group = Group(shard, object_key[0], object_key[1], row[width], row[width + 3])
            by_object[object_key] = group
            shard_groups.append(group)
        else:
            group.row_ids.append(row[width])
            group.attempts.append(row[width + 3])
        newest[group] = row  # the last row seen of a group is its newest
    return groups, newest, read, cut
