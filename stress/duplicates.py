"""Duplicates, each attributed to the fault that caused it, or reported as unexplained.

A duplicate is a successful call for a message (group, seq) that an earlier successful
call already delivered. The contract allows one only when the process of the earlier
delivery died or lost its lease before the delete committed. The rule: duplicate D is
explained by fault F when the delivery just before it, E, was in flight at F:

- kill, terminate: E was made by the SIGKILLed process (or the one whose connections
  were killed) in a batch it had not settled at the fault: the batch in flight (E's
  lease token, read when E started, is the token of that process's last call started
  before the fault completed), the batch settling behind it through a backlog (the
  token of the process's calls before those: `outbox.engine.pipeline`), or another batch
  it was still delivering (a straggler: a call of that batch ended less than `RECENT_S`
  before the fault, or after it); and D started after the fault. Duplicates of batches
  other than the last are counted apart (`duplicates_settling`), and the oldest
  redelivered delivery's age at the fault is reported (`oldest_redelivered_s`);
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

RECENT_S = 5.0  # a batch with a call that ended this close to a fault may be unsettled (a lease)


@dataclass(frozen=True)
class InFlight:
    """The batch (process and lease token) a fault caught, and from when it is lost."""

    kind: str
    pid: int
    token: str
    since: float
    behind: bool = False  # the batch settling behind the one in flight
    fault: int = -1  # its index in the faults


def in_flight(faults: list[dict[str, Any]], calls: list[Call]) -> list[InFlight]:
    """The batches each drainer fault caught unsettled."""
    by_pid: dict[int, list[Call]] = defaultdict(list)
    hung: dict[int, list[Call]] = defaultdict(list)
    for call in calls:
        by_pid[call.pid].append(call)
        if call.hung:
            hung[call.shard].append(call)
    batches = []
    for i, fault in enumerate(faults):
        if fault.get("skipped"):
            continue
        if fault["kind"] in ("kill", "terminate"):
            cut = fault.get("done_at", fault["at"])
            before = [c for c in by_pid.get(fault["pid"], []) if c.start <= cut]
            for token, behind in _unsettled(before, cut):
                batches.append(InFlight(fault["kind"], fault["pid"], token, cut, behind, i))
        elif fault["kind"] == "hang":
            for call in hung.get(fault["shard"], []):
                if call.start >= fault["at"] and call.token:
                    batches.append(InFlight("hang", call.pid, call.token, call.start, fault=i))
                    break
    return batches


def _unsettled(before: list[Call], cut: float) -> list[tuple[str, bool]]:
    """The tokens of a process's batches that may be unsettled at `cut`, from its calls
    started before it (in start order): the last one's, the one before (settling behind:
    True), and any batch with a call that ended within `RECENT_S` of the cut or after it
    (a straggler, or a batch still settling)."""
    tokens: list[str] = []  # distinct, by last use
    for call in reversed(before):
        if call.token and call.token not in tokens:
            tokens.append(call.token)
        if len(tokens) == 2:
            break
    found = [(token, i == 1) for i, token in enumerate(tokens)]
    recent = {c.token for c in before if c.token and c.end > cut - RECENT_S} - set(tokens)
    return found + [(token, True) for token in sorted(recent)]


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
    by_fault: Counter[int] = Counter()
    settling = 0
    oldest = 0.0  # seconds before its fault, the oldest delivery a fault redelivered
    unexplained: list[dict[str, Any]] = []
    for series in deliveries.values():
        for previous, again in pairwise(series):
            causes = [
                b for b in caught.get((previous.pid, previous.token), ()) if b.since < again.start
            ]
            if causes:
                cause = min(causes, key=lambda b: b.since)
                explained[cause.kind] += 1
                by_fault[cause.fault] += 1
                settling += cause.behind
                oldest = max(oldest, cause.since - previous.start)
            else:
                unexplained.append({"first": previous._asdict(), "again": again._asdict()})
    return {
        "duplicates": sum(explained.values()) + len(unexplained),
        "duplicates_explained": dict(sorted(explained.items())),
        "duplicates_settling": settling,
        "oldest_redelivered_s": round(oldest, 2),
        "duplicates_by_fault": [by_fault[i] for i, f in enumerate(faults) if not f.get("skipped")],
        "unexplained_duplicates": len(unexplained),
        "unexplained_examples": unexplained[:10],
    }


def per_fault(dups: dict[str, Any], faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Duplicate calls per fault injected: in all (total over faults), per kind (what
    each kind explains over its faults), the most one fault explained, and the mean
    over faults injected while a backlog of 1,000 rows or more pended."""
    injected = [f for f in faults if not f.get("skipped")]
    kinds = Counter(f["kind"] for f in injected)
    explained = dups["duplicates_explained"]
    each = dups["duplicates_by_fault"]
    backlogged = [n for f, n in zip(injected, each, strict=True) if f.get("backlog", 0) >= 1000]
    return {
        "duplicates_per_fault": round(dups["duplicates"] / len(injected), 1) if injected else None,
        "duplicates_per_fault_by_kind": {
            kind: round(explained.get(kind, 0) / n, 1) for kind, n in sorted(kinds.items())
        },
        "duplicates_one_fault_max": max(each, default=0),
        "faults_in_backlog": len(backlogged),
        "duplicates_per_fault_in_backlog": (
            round(sum(backlogged) / len(backlogged), 1) if backlogged else None
        ),
    }
