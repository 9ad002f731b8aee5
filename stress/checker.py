"""The checker: verifies the journal against what committed (`Written`).

- lost: a coalescing group whose newest committed seq never reached a successful
  receiver call, plus delivered messages that never committed (`phantoms`: a rolled-back
  or killed write was delivered).
- order_violations: per shard, a call for group g while a write W of another group,
  committed before g's oldest undelivered write, was still undelivered (W was visible,
  being committed earlier by the shard's only writer, and not yet deleted). Calls near
  a drainer fault, whose earlier deletes may not have committed, are counted as
  `order_unverified` instead.
- overlaps: per shard, a call starting before an earlier call ended (hung calls that ran
  past the receiver deadline are excluded: their lease is gone by design; counted
  as `hung_overlaps`).
- duplicates: extra successful calls carrying the same (group, seq).
- slowest_recovery_s: per drainer fault, time until every affected shard (one the
  faulted process delivered shortly before) delivered a write committed before the fault.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any

Group = tuple[int, int, int]


def check(info: dict[str, Any]) -> dict[str, Any]:
    from stress.models import Journal, Written

    lease = float(info["lease_seconds"])
    writes = list(Written.objects.values_list("shard", "category", "obj", "seq", "sseq", "at"))
    calls = list(
        Journal.objects.values_list(
            "shard", "category", "obj", "seq", "sseq", "pid", "start", "end", "ok", "hung"
        ).order_by("start")
    )
    committed = {(w[0], w[1], w[2], w[3]) for w in writes}
    newest: dict[Group, int] = {}
    for s, c, o, q, _, _ in writes:
        newest[(s, c, o)] = max(newest.get((s, c, o), 0), q)
    delivered: dict[tuple[int, int, int, int], int] = defaultdict(int)
    for s, c, o, q, _, _, _, _, ok, _ in calls:
        if ok:
            delivered[(s, c, o, q)] += 1
    lost = sum(1 for g, q in newest.items() if (*g, q) not in delivered)
    phantoms = sum(1 for key in delivered if key not in committed)
    duplicates = sum(n - 1 for n in delivered.values())

    overlaps = hung_overlaps = 0
    by_shard: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for call in calls:
        by_shard[call[0]].append(call)
    for shard_calls in by_shard.values():
        busy_until = 0.0
        hung_until = 0.0
        for call in shard_calls:
            start, end, hung = call[6], call[7], call[9]
            if hung:
                hung_until = max(hung_until, end)
                continue
            if start < busy_until:
                overlaps += 1
            elif start < hung_until:
                hung_overlaps += 1
            busy_until = max(busy_until, end)

    tainted = _tainted(info, by_shard, lease)
    violations, unverified = _order(writes, by_shard, tainted)
    return {
        "messages": len(writes),
        "receiver_calls": len(calls),
        "faults": len(info["faults"]),
        "lost": lost,
        "phantoms": phantoms,
        "order_violations": violations,
        "order_unverified": unverified,
        "overlaps": overlaps,
        "hung_overlaps": hung_overlaps,
        "duplicates": duplicates,
        "slowest_recovery_s": _recovery(info, writes, by_shard, lease),
        "restarts": len(info["restarts"]),
        # Processes that exited on their own (not SIGKILLed) and had to be restarted.
        "crashes": sum(1 for r in info["restarts"] if r["exit"] != -9),
        "seconds": round(info["seconds"], 1),
        "drained": info["drained"],
        "left_in_outbox": info["left_in_outbox"],
    }


def _affected(fault: dict[str, Any], by_shard: dict[int, list[Any]], lease: float) -> set[int]:
    """Shards a drainer fault may have left with undeleted or in-flight deliveries."""
    at = fault["at"]
    if fault["kind"] == "hang":
        # The hung call and every shard its process held in that batch.
        pids = {c[5] for c in by_shard.get(fault["shard"], []) if c[9]}
        shards = {fault["shard"]}
    elif fault["kind"] in ("kill", "terminate"):
        pids, shards = {fault["pid"]}, set()
    else:
        return set()
    for shard, shard_calls in by_shard.items():
        for c in shard_calls:
            if c[5] in pids and at - 3 * lease <= c[6] <= at + 4 * lease:
                shards.add(shard)
                break
    return shards


def _tainted(
    info: dict[str, Any], by_shard: dict[int, list[Any]], lease: float
) -> dict[int, list[tuple[float, float]]]:
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for fault in info["faults"]:
        for shard in _affected(fault, by_shard, lease):
            spans[shard].append((fault["at"] - 3 * lease, fault["at"] + 6 * lease))
    return spans


def _order(
    writes: list[Any], by_shard: dict[int, list[Any]], tainted: dict[int, list[tuple[float, float]]]
) -> tuple[int, int]:
    per_group: dict[Group, list[tuple[int, int]]] = defaultdict(list)  # (seq, sseq) by seq
    for s, c, o, q, ss, _ in writes:
        per_group[(s, c, o)].append((q, ss))
    for rows in per_group.values():
        rows.sort()
    groups_of_shard: dict[int, list[Group]] = defaultdict(list)
    for g in per_group:
        groups_of_shard[g[0]].append(g)
    violations = unverified = 0
    for shard, shard_calls in by_shard.items():
        pointer = {g: 0 for g in groups_of_shard[shard]}
        heap = [(per_group[g][0][1], g) for g in groups_of_shard[shard]]
        heapq.heapify(heap)

        def head(g: Group, pointer: dict[Group, int] = pointer) -> int | None:
            i = pointer[g]
            rows = per_group[g]
            return rows[i][1] if i < len(rows) else None

        for s, c, o, q, _, _, start, _, ok, _hung in shard_calls:
            g = (s, c, o)
            if g in pointer:
                mine = head(g)
                if mine is not None and per_group[g][pointer[g]][0] <= q:
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
                        if any(a <= start <= b for a, b in tainted.get(shard, [])):
                            unverified += 1
                        else:
                            violations += 1
            if ok and g in pointer:
                rows = per_group[g]
                while pointer[g] < len(rows) and rows[pointer[g]][0] <= q:
                    pointer[g] += 1
                nxt = head(g)
                if nxt is not None:
                    heapq.heappush(heap, (nxt, g))
    return violations, unverified


def _recovery(
    info: dict[str, Any], writes: list[Any], by_shard: dict[int, list[Any]], lease: float
) -> float:
    """Longest time from a fault (end of a `fail`) until an affected shard that had a
    committed, undelivered write at that moment had a successful call again."""
    slowest = 0.0
    for fault in info["faults"]:
        at = fault.get("until", fault["at"]) if fault["kind"] == "fail" else fault["at"]
        shards = {fault["shard"]} if fault["kind"] == "fail" else _affected(fault, by_shard, lease)
        for shard in shards:
            calls = by_shard.get(shard, [])
            covered: dict[Group, int] = {}
            for c in calls:
                if c[8] and c[6] < at:
                    g = (c[0], c[1], c[2])
                    covered[g] = max(covered.get(g, 0), c[3])
            pending = [
                w
                for w in writes
                if w[0] == shard and w[5] < at and covered.get((w[0], w[1], w[2]), 0) < w[3]
            ]
            after = [c[6] for c in calls if c[8] and c[6] > at]
            if pending and after:
                slowest = max(slowest, min(after) - at)
    return round(slowest, 2)
