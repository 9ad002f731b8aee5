"""The relay leg's checker: what a consumer of the run's queue saw, in queue order,
against what committed (`Written`), what the relay reported (`stress/relay.py`) and
the journal.

A consumer drops repeats by message id (the first copy counts), so every check below
is on the queue with repeats dropped; the repeats are counted (`relay_repeats`).

- relay_lost: a group whose newest committed message never reached the queue;
  relay_phantoms: a message in the queue that never committed;
- relay_confirmed_missing: a message the broker confirmed to the relay but the queue
  lacks (the queue is durable and only this run consumes it: must be 0);
- relay_group_regressions: a message older (lower seq) than one of its group the
  consumer already had: a consumer would apply a stale state;
- relay_order_violations (`stress/order.py`'s rule on the queue's order): per shard, a
  message of group g while a write of another group, committed before g's oldest
  write not yet in the queue, was not in the queue yet. The engine delivers a group's
  newest row at the place of its oldest undeleted row, so when an earlier message of g
  reached the queue without being settled (`unsettled`: a copy arrived that the broker
  never confirmed, a confirm lost in a cut; the journaling receiver failed for it;
  its drainer died before the delete) the next one of g may pass another group's older
  write. Such a message, and one the relay published near a drainer fault of its shard
  (`order.tainted`), counts as `relay_order_unverified`, the rest as violations;
- reported: relay_arrived_unconfirmed, copies in the queue beyond the broker's confirms
  of their message (publishes the relay reported failed that arrived all the same);
- relay_id_mismatches: a message whose AMQP message_id, outbox-message-id header and
  CloudEvents id disagree.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from stress import journal, order
from stress.broker import Received
from stress.journal import Call, Group, Write


def check(info: dict[str, Any], received: list[Received], tmp: Path) -> dict[str, Any]:
    from stress import relay
    from stress.models import Journal

    writes, calls = journal.load()
    confirmed, confirms, failed = relay.outcomes(tmp)
    ok_calls = Journal.objects.filter(ok=True)
    journaled = {str(i) for i in ok_calls.values_list("message_id", flat=True)}
    return rules(info, received, writes, calls, (confirmed, confirms, failed), journaled)


def rules(
    info: dict[str, Any],
    received: list[Received],
    writes: list[Write],
    calls: list[Call],
    reported: tuple[dict[str, float], Counter[str], dict[str, str]],
    journaled: set[str],
) -> dict[str, Any]:
    """The checks on what the consumer `received`, given what committed (`writes`), the
    journal (`calls`; `journaled`: the message ids of its successful calls) and what
    the relay reported (`relay.outcomes`: id -> first confirmed when, confirms per id,
    id -> a failure)."""
    confirmed, confirms, failed = reported
    firsts = _first_copies(received)
    committed = {(*w.group, w.seq) for w in writes}
    newest: dict[Group, int] = {}
    for w in writes:
        newest[w.group] = max(newest.get(w.group, 0), w.seq)
    got = {(m.shard, m.category, m.obj, m.seq) for m in firsts}
    ids = {m.message_id for m in firsts}
    # Copies beyond the broker's confirms: publishes reported failed that arrived (a
    # confirm lost in a cut).
    copies = Counter(m.message_id for m in received)
    unconfirmed = {i: n - confirms[i] for i, n in copies.items() if n > confirms[i]}
    unsettled = set(unconfirmed) | (ids - journaled)
    spans = order.tainted(info["faults"], journal.by_shard(calls), float(info["lease_seconds"]))
    violations, unverified = _order(firsts, writes, spans, confirmed, unsettled)
    return {
        "relay_received": len(received),
        "relay_messages": len(firsts),
        "relay_repeats": len(received) - len(firsts),
        "relay_redelivered_flag": sum(1 for m in received if m.redelivered),
        "relay_lost": sum(1 for g, q in newest.items() if (*g, q) not in got),
        "relay_phantoms": sum(1 for key in got if key not in committed),
        "relay_confirmed": len(confirmed),
        "relay_confirmed_missing": sum(1 for message_id in confirmed if message_id not in ids),
        "relay_failures_reported": len(failed),
        "relay_arrived_unconfirmed": sum(unconfirmed.values()),
        "relay_group_regressions": _regressions(firsts),
        "relay_order_violations": violations,
        "relay_order_unverified": unverified,
        "relay_id_mismatches": sum(1 for m in received if not m.consistent),
    }


def _first_copies(received: list[Received]) -> list[Received]:
    """The queue with repeats dropped, as a consumer deduplicating by message id sees it."""
    seen: set[str] = set()
    firsts = []
    for m in received:
        if m.message_id not in seen:
            seen.add(m.message_id)
            firsts.append(m)
    return firsts


def _regressions(firsts: list[Received]) -> int:
    top: dict[Group, int] = {}
    regressions = 0
    for m in firsts:
        group = (m.shard, m.category, m.obj)
        if m.seq < top.get(group, 0):
            regressions += 1
        top[group] = max(top.get(group, 0), m.seq)
    return regressions


def _order(
    firsts: list[Received],
    writes: list[Write],
    spans: dict[int, list[tuple[float, float]]],
    confirmed: dict[str, float],
    unsettled: set[str],
) -> tuple[int, int]:
    """(violations, unverified) of the queue's order per shard."""
    # The queue as receiver calls, in queue order (`start`: the position).
    as_calls: dict[int, list[Call]] = defaultdict(list)
    for position, m in enumerate(firsts):
        fields = (m.shard, m.category, m.obj, m.seq, m.sseq, "", 0, position, position)
        as_calls[m.shard].append(Call(*fields, True, False, False, "", ""))
    per_group: dict[Group, list[tuple[int, int]]] = defaultdict(list)
    for w in writes:
        per_group[w.group].append((w.seq, w.sseq))
    for rows in per_group.values():
        rows.sort()
    groups_of_shard: dict[int, list[Group]] = defaultdict(list)
    for g in per_group:
        groups_of_shard[g[0]].append(g)
    previous = _previous_of_group(firsts)
    violations = unverified = 0
    for shard, shard_calls in as_calls.items():
        for position in order._shard_order(shard_calls, groups_of_shard[shard], per_group):
            m = firsts[int(position)]
            at = confirmed.get(m.message_id, 0.0)
            near_fault = any(a <= at <= b for a, b in spans.get(shard, []))
            if near_fault or previous.get(int(position)) in unsettled:
                unverified += 1
            else:
                violations += 1
    return violations, unverified


def _previous_of_group(firsts: list[Received]) -> dict[int, str]:
    """Position -> message id of the message of the same group just before it."""
    last: dict[Group, str] = {}
    previous: dict[int, str] = {}
    for position, m in enumerate(firsts):
        group = (m.shard, m.category, m.obj)
        if group in last:
            previous[position] = last[group]
        last[group] = m.message_id
    return previous
