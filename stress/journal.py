"""What the checker reads: committed writes and journaled receiver calls, as tuples."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

Group = tuple[int, int, int]  # shard, category, object


class Write(NamedTuple):
    shard: int
    category: int
    obj: int
    seq: int
    sseq: int
    at: float

    @property
    def group(self) -> Group:
        return (self.shard, self.category, self.obj)


class Call(NamedTuple):
    shard: int
    category: int
    obj: int
    seq: int
    sseq: int
    process: str
    pid: int
    start: float
    end: float
    ok: bool
    hung: bool
    slow: bool
    token: str
    holder: str

    @property
    def group(self) -> Group:
        return (self.shard, self.category, self.obj)

    @property
    def key(self) -> tuple[int, int, int, int]:
        """The message delivered: group and seq."""
        return (self.shard, self.category, self.obj, self.seq)

    @property
    def leased(self) -> bool:
        """The shard's lease named this call's process when the call started."""
        parts = self.holder.rsplit(":", 2)
        return bool(self.token) and len(parts) == 3 and parts[1] == str(self.pid)


def load() -> tuple[list[Write], list[Call]]:
    from stress.models import Journal, Written

    writes = [
        Write(*row)
        for row in Written.objects.values_list("shard", "category", "obj", "seq", "sseq", "at")
    ]
    rows = Journal.objects.values_list(*Call._fields).order_by("start")
    calls = [Call(*row) for row in rows]
    return writes, calls


def by_shard(calls: list[Call]) -> dict[int, list[Call]]:
    """Calls per shard, in start order (as `calls` is)."""
    shards: dict[int, list[Call]] = defaultdict(list)
    for call in calls:
        shards[call.shard].append(call)
    return shards
