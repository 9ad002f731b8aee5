"""The demo's check: every receiver saw what committed, and nothing else.

Each function returns a list of problems (empty when the check holds).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from accounts.billing import ENDPOINT as BILLING
from accounts.demo.drain import DrainReport
from accounts.demo.traffic import ROLLBACK_MARKER, Tally
from accounts.models import (
    AuditLogEntry,
    Organization,
    OrganizationMirror,
    Project,
    ProjectMirror,
    UserAccount,
    UserMirror,
    WebhookCall,
)
from accounts.receivers import AUDIT_SINK
from outbox.models import ControlOutbox, RegionOutbox

State = dict[Any, Any]


def verify(tally: Tally, drained: DrainReport) -> list[str]:
    """Run every check; return the problems found."""
    return [
        *check_outboxes_empty(),
        *check_mirrors(),
        *check_billing(),
        *check_audit_exactly_once(),
        *check_rollbacks(tally),
        *check_accounting(tally, drained),
    ]


def compare(what: str, source: State, mirror: State) -> list[str]:
    """Problems if `mirror` does not hold exactly `source`'s keys with equal values."""
    missing = source.keys() - mirror.keys()
    extra = mirror.keys() - source.keys()
    stale = [key for key in source.keys() & mirror.keys() if source[key] != mirror[key]]
    if not (missing or extra or stale):
        return []
    example = (
        f"; e.g. {stale[0]}: got {mirror[stale[0]]}, expected {source[stale[0]]}" if stale else ""
    )
    return [f"{what}: {len(missing)} missing, {len(extra)} extra, {len(stale)} stale{example}"]


def check_outboxes_empty() -> list[str]:
    left = {
        "RegionOutbox": RegionOutbox.objects.count(),
        "ControlOutbox": ControlOutbox.objects.count(),
    }
    return [f"{table} still holds {count} rows" for table, count in left.items() if count]


def check_mirrors() -> list[str]:
    """Latest state arrived: each mirror equals its source, object for object."""
    users = {(u.region, u.id): u.state() for u in UserAccount.objects.all()}
    user_mirrors = {(m.region, m.user_id): m.state() for m in UserMirror.objects.all()}
    return [
        *compare(
            "organization mirror",
            {o.id: o.state() for o in Organization.objects.all()},
            {m.id: m.state() for m in OrganizationMirror.objects.all()},
        ),
        *compare(
            "project mirror",
            {p.id: p.state() for p in Project.objects.all()},
            {m.id: m.state() for m in ProjectMirror.objects.all()},
        ),
        *compare("user mirror", users, user_mirrors),
    ]


def check_billing() -> list[str]:
    """Billing's last call per organization is its current state (None once deleted)."""
    last: State = {}
    for object_id, payload in (
        WebhookCall.objects.filter(endpoint=BILLING)
        .order_by("id")
        .values_list("object_id", "payload")
    ):
        last[object_id] = payload
    current = {o.id: o.state() for o in Organization.objects.all()}
    gone = {object_id: None for object_id in last.keys() - current.keys()}
    return compare("billing", {**current, **gone}, last)


def check_audit_exactly_once() -> list[str]:
    """Each committed audit entry reached the sink exactly once; no other entry did."""
    calls = Counter(
        WebhookCall.objects.filter(endpoint=AUDIT_SINK).values_list("object_id", flat=True)
    )
    entries = set(AuditLogEntry.objects.values_list("id", flat=True))
    missing = entries - calls.keys()
    extra = calls.keys() - entries
    repeated = [entry for entry, count in calls.items() if count > 1]
    if not (missing or extra or repeated):
        return []
    return [f"audit sink: {len(missing)} missing, {len(extra)} unknown, {len(repeated)} repeated"]


def check_rollbacks(tally: Tally) -> list[str]:
    """Nothing written in a rolled-back transaction or savepoint left a row or arrived."""
    problems = []
    if tally.rollback_leftovers:
        problems.append(f"rolled-back transactions left {tally.rollback_leftovers} outbox rows")
    seen = [
        *OrganizationMirror.objects.values_list("name", flat=True),
        *UserMirror.objects.values_list("name", flat=True),
        *(json.dumps(p) for p in WebhookCall.objects.values_list("payload", flat=True)),
    ]
    leaked = sum(ROLLBACK_MARKER in text for text in seen)
    if leaked:
        problems.append(f"{leaked} rolled-back changes reached a receiver")
    return problems


def check_accounting(tally: Tally, drained: DrainReport) -> list[str]:
    """Every row written was retired exactly once: by a synchronous flush or the drain."""
    retired = tally.flushed + drained.stats.rows_retired
    if retired == tally.written:
        return []
    return [f"{tally.written} outbox rows written but {retired} retired"]
