"""Per-shard order against commit order, and which shards a drainer fault touched.

A call for group g is out of order when a write W of another group of the same shard,
committed before g's oldest undelivered write, was still undelivered (W was visible,
being committed earlier by the shard's only writer, and not yet deleted). Calls near a
drainer fault, whose earlier deletes may not have committed, are `order_unverified`.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any

from stress.journal import Call, Group, Write


def anchor(fault: dict[str, Any], by_shard: dict[int, list[Call]]) -> float:
    """When a fault took effect: a hang when its hung call started (the next call of
    the shard in a drainer, which may come long after the fault was set up on an idle
    shard); the others when injected."""
    if fault["kind"] == "hang":
        hung = [
            c.start for c in by_shard.get(fault["shard"], []) if c.hung and c.start >= fault["at"]
        ]
        if hung:
            return min(hung)
    return float(fault["at"])


def affected(fault: dict[str, Any], by_shard: dict[int, list[Call]], lease: float) -> set[int]:
    """Shards a drainer fault may have left with undeleted or in-flight deliveries."""
    at = anchor(fault, by_shard)
    if fault["kind"] == "hang":
        # The hung call and every shard its process held in that batch.
        pids = {c.pid for c in by_shard.get(fault["shard"], []) if c.hung}
        shards = {fault["shard"]}
    elif fault["kind"] in ("kill", "terminate"):
        pids, shards = {fault["pid"]}, set()
    else:
        return set()
    for shard, shard_calls in by_shard.items():
        for c in shard_calls:
            if c.pid in pids and at - 3 * lease <= c.start <= at + 4 * lease:
                shards.add(shard)
                break
    return shards


def tainted(
    faults: list[dict[str, Any]], by_shard: dict[int, list[Call]], lease: float
) -> dict[int, list[tuple[float, float]]]:
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for fault in faults:
        at = anchor(fault, by_shard)
        for shard in affected(fault, by_shard, lease):
            spans[shard].append((at - 3 * lease, at + 6 * lease))
    return spans


def check_order(
    writes: list[Write],
    by_shard: dict[int, list[Call]],
    spans: dict[int, list[tuple[float, float]]],
) -> tuple[int, int]:
    """(order violations, order_unverified)."""
    per_group: dict[Group, list[tuple[int, int]]] = defaultdict(list)  # (seq, sseq) by seq
    for w in writes:
        per_group[w.group].append((w.seq, w.sseq))
    for rows in per_group.values():
        rows.sort()
    groups_of_shard: dict[int, list[Group]] = defaultdict(list)
    for g in per_group:
        groups_of_shard[g[0]].append(g)
    violations = unverified = 0
    for shard, shard_calls in by_shard.items():
        bad = _shard_order(shard_calls, groups_of_shard[shard], per_group)
        for start in bad:
            if any(a <= start <= b for a, b in spans.get(shard, [])):
                unverified += 1
            else:
                violations += 1
    return violations, unverified


def _shard_order(
    calls: list[Call], groups: list[Group], per_group: dict[Group, list[tuple[int, int]]]
) -> list[float]:
    """Start times of the calls of one shard that jumped ahead of an older write."""
    pointer = {g: 0 for g in groups}
    heap = [(per_group[g][0][1], g) for g in groups]
    heapq.heapify(heap)
    bad: list[float] = []

    def head(g: Group) -> int | None:
        i = pointer[g]
        rows = per_group[g]
        return rows[i][1] if i < len(rows) else None

    for call in calls:
        g = call.group
        if g not in pointer:
            continue
        mine = head(g)
        if mine is not None and per_group[g][pointer[g]][0] <= call.seq:
            # Smallest uncovered sseq among the other groups of this shard.
            other = None
            popped = []
            while heap:
                ss, h = heap[0]
                if head(h) != ss:
                    heapq.heappop(heap)
                    continue
                if h == g:
                    popped.append(heapq.heappop(heap))
                    continue
                other = ss
                break
            for item in popped:
                heapq.heappush(heap, item)
            if other is not None and other < mine:
                bad.append(call.start)
        if call.ok:
            rows = per_group[g]
            while pointer[g] < len(rows) and rows[pointer[g]][0] <= call.seq:
                pointer[g] += 1
            nxt = head(g)
            if nxt is not None:
                heapq.heappush(heap, (nxt, g))
    return bad
