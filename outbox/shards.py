"""The shard key, shared by the write path and the engine."""

from __future__ import annotations

from typing import NamedTuple


class ShardKey(NamedTuple):
    """(region_name, shard_scope, shard_identifier); region_name is "" for region outboxes."""

    region_name: str
    shard_scope: int
    shard_identifier: int

    def __str__(self) -> str:
        prefix = f"{self.region_name}/" if self.region_name else ""
        return f"{prefix}{self.shard_scope}/{self.shard_identifier}"
