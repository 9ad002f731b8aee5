"""The checker: verifies the journal against what committed (`Written`).

- lost: a coalescing group whose newest committed seq never reached a successful
  receiver call, plus delivered messages that never committed (`phantoms`: a rolled-back
  or killed write was delivered).
- order_violations: per shard, against commit order (`stress/order.py`).
- overlaps: per shard, a call starting before an earlier call ended (hung calls that ran
  past the receiver deadline are excluded: their lease is gone by design; counted
  as `hung_overlaps`).
- unleased_calls: calls that started while the shard's lease row did not name their
  process (whoever calls a receiver must hold the shard).
- duplicates (duplicate receiver calls): successful calls of the journaling receiver for
  a (group, seq) beyond the first successful one, each attributed to a fault or counted
  in `unexplained_duplicates` (`stress/duplicates.py`), and per fault injected.
- graceful: the facts of each SIGTERM with a receiver in flight (`stress/stopcheck.py`).
- effects of the inbox receiver: duplicate, lost, phantom (`stress/effects.py`).
- slowest_recovery_s: per drainer fault, time until every affected shard (one the
  faulted process delivered shortly before) delivered a write committed before the fault.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from stress import duplicates, effects, journal, order, stopcheck
from stress.journal import Call, Group, Write


def check(info: dict[str, Any]) -> dict[str, Any]:
    lease = float(info["lease_seconds"])
    writes, calls = journal.load()
    by_shard = journal.by_shard(calls)
    committed = {(*w.group, w.seq) for w in writes}
    newest: dict[Group, int] = {}
    for w in writes:
        newest[w.group] = max(newest.get(w.group, 0), w.seq)
    delivered = {c.key for c in calls if c.ok}
    faults = info["faults"]
    overlaps, hung_overlaps = _overlaps(by_shard)
    spans = order.tainted(faults, by_shard, lease)
    violations, unverified = order.check_order(writes, by_shard, spans)
    dups = duplicates.attribute(faults, calls)
    injected = dict(sorted(Counter(f["kind"] for f in faults if not f.get("skipped")).items()))
    stops = stopcheck.check_stops(faults, calls, writes, lease)
    return {
        "messages": len(writes),
        "shards": len({w.shard for w in writes}),
        "receiver_calls": len(calls),
        "flush_calls": sum(1 for c in calls if c.process.startswith("writer")),
        "faults": injected,
        "faults_skipped": sum(1 for f in faults if f.get("skipped")),
        "lost": sum(1 for g, q in newest.items() if (*g, q) not in delivered),
        "phantoms": sum(1 for key in delivered if key not in committed),
        "order_violations": violations,
        "order_unverified": unverified,
        "overlaps": overlaps,
        "hung_overlaps": hung_overlaps,
        "unleased_calls": sum(1 for c in calls if not c.leased),
        **dups,
        **duplicates.per_fault(dups, faults),
        **effects.check(writes),
        "graceful": stopcheck.summary(stops),
        "graceful_stops": stops,
        "slowest_recovery_s": _recovery(faults, writes, by_shard, lease),
        "restarts": len(info["restarts"]),
        # Processes that exited on their own (not SIGKILLed, not stopped) and restarted.
        "crashes": sum(1 for r in info["restarts"] if r["exit"] != -9 and not r["cause"]),
        "seconds": round(info["seconds"], 1),
        "drained": info["drained"],
        "left_in_outbox": info["left_in_outbox"],
        "max_backlog": info.get("max_backlog"),
        "max_backlog_at_s": info.get("max_backlog_at_s"),
    }


def _overlaps(by_shard: dict[int, list[Call]]) -> tuple[int, int]:
    overlaps = hung_overlaps = 0
    for shard_calls in by_shard.values():
        busy_until = 0.0
        hung_until = 0.0
        for call in shard_calls:
            if call.hung:
                hung_until = max(hung_until, call.end)
                continue
            if call.start < busy_until:
                overlaps += 1
            elif call.start < hung_until:
                hung_overlaps += 1
            busy_until = max(busy_until, call.end)
    return overlaps, hung_overlaps


def _recovery(
    faults: list[dict[str, Any]], writes: list[Write], by_shard: dict[int, list[Call]], lease: float
) -> float:
    """Longest time from a fault (end of a `fail`) until an affected shard that had a
    committed, undelivered write at that moment had a successful call again."""
    writes_of: dict[int, list[Write]] = defaultdict(list)
    for w in writes:
        writes_of[w.shard].append(w)
    slowest = 0.0
    for fault in faults:
        if fault.get("skipped"):
            continue
        at = fault.get("until", fault["at"]) if fault["kind"] == "fail" else fault["at"]
        if fault["kind"] == "fail":
            shards = {fault["shard"]}
        else:
            shards = order.affected(fault, by_shard, lease)
        for shard in shards:
            calls = by_shard.get(shard, [])
            covered: dict[Group, int] = {}
            for c in calls:
                if c.ok and c.start < at:
                    covered[c.group] = max(covered.get(c.group, 0), c.seq)
            pending = any(w.at < at and covered.get(w.group, 0) < w.seq for w in writes_of[shard])
            after = [c.start for c in calls if c.ok and c.start > at]
            if pending and after:
                slowest = max(slowest, min(after) - at)
    return round(slowest, 2)
