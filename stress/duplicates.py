"""Duplicates, each attributed to the fault that caused it, or reported as unexplained.

A duplicate is a successful call for a message (group, seq) that an earlier successful
call already delivered. The contract allows one only when the process of the earlier
delivery died or lost its lease before the delete committed. The rule: duplicate D is
explained by fault F when the delivery just before it, E, was in flight at F:

- kill, terminate: E was made by the SIGKILLed process (or the one whose connections
  were killed) in the batch it had in flight at the fault, i.e. E's lease token (read
  when E started) is the token of that process's last call started before the fault
  completed; and D started after the fault;
- hang: E was made in the batch of the hung call (same lease token: the whole batch's
  lease lapsed while the receiver hung past the deadline); and D started after the
  hung call started.

Each redelivery needs its own fault: the delivery before it must have been in flight.
A graceful stop explains nothing (it must settle what it delivered), nor does a failing
receiver. The rest are `unexplained`, which must be 0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from stress.journal import Call


@dataclass(frozen=True)
class InFlight:
    """The batch (process and lease token) a fault caught, and from when it is lost."""

    kind: str
    pid: int
    token: str
    since: float


def in_flight(faults: list[dict[str, Any]], calls: list[Call]) -> list[InFlight]:
    """The batch each drainer fault caught in flight."""
    by_pid: dict[int, list[Call]] = defaultdict(list)
    hung: dict[int, list[Call]] = defaultdict(list)
    for call in calls:
        by_pid[call.pid].append(call)
        if call.hung:
            hung[call.shard].append(call)
    batches = []
    for fault in faults:
        if fault.get("skipped"):
            continue
        if fault["kind"] in ("kill", "terminate"):
            cut = fault.get("done_at", fault["at"])
            before = [c for c in by_pid.get(fault["pid"], []) if c.start <= cut]
            if before and before[-1].token:
                batches.append(InFlight(fault["kind"], fault["pid"], before[-1].token, cut))
        elif fault["kind"] == "hang":
            for call in hung.get(fault["shard"], []):
                if call.start >= fault["at"] and call.token:
                    batches.append(InFlight("hang", call.pid, call.token, call.start))
                    break
    return batches


def attribute(faults: list[dict[str, Any]], calls: list[Call]) -> dict[str, Any]:
    """Count duplicates, explained per fault kind, and unexplained (with examples)."""
    caught: dict[tuple[int, str], list[InFlight]] = defaultdict(list)  # by process, token
    for batch in in_flight(faults, calls):  # one batch may be caught by several faults
        caught[(batch.pid, batch.token)].append(batch)
    deliveries: dict[tuple[int, int, int, int], list[Call]] = defaultdict(list)
    for call in calls:  # in start order
        if call.ok:
            deliveries[call.key].append(call)
    explained: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    for series in deliveries.values():
        for previous, again in pairwise(series):
            causes = [
                b for b in caught.get((previous.pid, previous.token), ()) if b.since < again.start
            ]
            if causes:
                explained[min(causes, key=lambda b: b.since).kind] += 1
            else:
                unexplained.append({"first": previous._asdict(), "again": again._asdict()})
    return {
        "duplicates": sum(explained.values()) + len(unexplained),
        "duplicates_explained": dict(sorted(explained.items())),
        "unexplained_duplicates": len(unexplained),
        "unexplained_examples": unexplained[:10],
    }
