"""A snapshot of the backlog, shared by `manage.py outbox_status`, the health check, the
drain loop's heartbeat and the admin.

Per table and per scope: pending rows, shards, due rows, the lag (the age of the oldest
due row: how long the oldest deliverable message has waited), failing rows and the
highest attempt among the pending rows (`highest_attempt`; the table also gives
`OUTBOX_MAX_ATTEMPTS` as `attempt_limit`, None when messages are retried for ever), dead
letters, and shards by lease state: held by a live worker; backing off after a failure;
retry due (the back-off is over, the shard waits for a drain: routine); expired (a
worker's lease ran out: the worker died or stopped renewing, the one stuck state, which
`--max-expired` counts); plus the worst shards (most attempts) with their last error. A
table's figures are the sums (or the maximum) of its scopes', read by one grouped query.
A table costs a fixed number of aggregate queries whatever its size; lease states come
from `ShardLease.objects` (held, backing_off, retry_due, abandoned) and dead letters from
the outbox QuerySet (`pending()`, `dead()`). `max_attempts` is the deprecated name of
`highest_attempt`.

What is paused (`outbox.models.pause`) comes with it: the table's pauses (`paused`, one
entry each, naming the part), and per scope whether it is paused whole (`paused`) and
how many pauses fall in it (`paused_parts`: its own, its shards' and its categories');
a paused scope is listed even when it holds nothing.

A database alias that DATABASES does not have raises `outbox.exceptions.UnknownDatabase`
naming it and the configured ones, as `manage.py outbox_status --database` says.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.exceptions import UnknownDatabase
from outbox.models import OutboxBase, OutboxPause, ShardLease

# Failing or dead shards listed per table, worst (most attempts) first.
WORST_SHARDS = 5


def table_status(model: type[OutboxBase], using: str | None = None) -> dict[str, Any]:
    """The status of one outbox table as JSON-friendly values (see the module doc)."""
    alias = known_database(using) or model._default_manager.db
    manager = model._default_manager.using(alias)
    now = timezone.now()
    pauses = list(OutboxPause.objects.using(alias).of(model).order_by("paused_at", "id"))
    scopes = _scopes(model, alias, manager.pending(), now, pauses)
    highest = max((scope["highest_attempt"] for scope in scopes), default=0)
    return {
        "table": model._meta.label,
        "database": alias,
        "rows": sum(scope["rows"] for scope in scopes),
        "due_rows": sum(scope["due_rows"] for scope in scopes),
        "failing_rows": sum(scope["failing_rows"] for scope in scopes),
        "dead_letters": sum(scope["dead_letters"] for scope in scopes),
        "highest_attempt": highest,
        "max_attempts": highest,  # deprecated: the highest attempt, not a limit
        "attempt_limit": outbox_settings.MAX_ATTEMPTS or None,
        "oldest_age_seconds": max((scope["oldest_age_seconds"] for scope in scopes), default=0.0),
        "lag_seconds": max((scope["lag_seconds"] for scope in scopes), default=0.0),
        "leased_shards": sum(scope["held_shards"] for scope in scopes),
        "backing_off_shards": sum(scope["backing_off_shards"] for scope in scopes),
        "retry_due_shards": sum(scope["retry_due_shards"] for scope in scopes),
        "expired_shards": sum(scope["expired_shards"] for scope in scopes),
        "paused": [pause_entry(found) for found in pauses],
        "scopes": scopes,
        "worst_shards": _worst_shards(model, manager),
    }


def pause_entry(found: OutboxPause) -> dict[str, Any]:
    """One pause as JSON-friendly values: what it names, since when, by whom, why."""
    return {
        "kind": found.part.kind,
        "shard_scope": found.shard_scope,
        "category_value": found.category,
        "part": str(found.part),
        "scope": registry.scope_name(found.shard_scope),
        "shard_identifier": found.shard_identifier,
        "region_name": found.region_name,
        "category": None if found.category is None else registry.category_name(found.category),
        "paused_at": found.paused_at.isoformat(),
        "paused_by": found.paused_by,
        "reason": found.reason,
    }


def known_database(alias: str | None) -> str | None:
    """`alias` if DATABASES has it, else UnknownDatabase (None stays None: each table's
    own database)."""
    if alias is not None and alias not in settings.DATABASES:
        raise UnknownDatabase(alias, list(settings.DATABASES))
    return alias


def _counts() -> dict[str, Any]:
    due = Q(scheduled_for__lte=Now())
    return {
        "rows": Count("id"),
        "shards": Count("shard_identifier", distinct=True),
        "due_rows": Count("id", filter=due),
        "failing_rows": Count("id", filter=Q(attempts__gt=0)),
        "highest_attempt": Max("attempts"),
        "oldest": Min("date_added"),
        "oldest_due": Min("date_added", filter=due),
    }


def _scopes(
    model: type[OutboxBase],
    alias: str,
    pending: QuerySet[Any],
    now: datetime,
    pauses: list[OutboxPause],
) -> list[dict[str, Any]]:
    """One entry per scope that has pending rows, dead letters or leases. The pending
    rows' figures come from one grouped query, the table's are their sums: a row written
    or coming due between two queries cannot make them disagree."""
    by_scope: dict[int, dict[str, Any]] = defaultdict(_empty_scope)
    for entry in pending.values("shard_scope").annotate(**_counts()).order_by():
        scope = by_scope[entry["shard_scope"]]
        scope.update(
            {
                key: entry[key] or 0
                for key in ("rows", "shards", "due_rows", "failing_rows", "highest_attempt")
            }
        )
        scope["lag_seconds"] = _age(now, entry["oldest_due"])
        scope["oldest_age_seconds"] = _age(now, entry["oldest"])
    dead = model._default_manager.using(alias).dead()
    for entry in dead.values("shard_scope").annotate(n=Count("id")).order_by():
        by_scope[entry["shard_scope"]]["dead_letters"] = entry["n"]
    leases = ShardLease.objects.using(alias).of(model)
    for state, leased in (
        ("held_shards", leases.held()),
        ("expired_shards", leases.abandoned()),
        ("backing_off_shards", leases.backing_off()),
        ("retry_due_shards", leases.retry_due()),
    ):
        for entry in leased.values("shard_scope").annotate(n=Count("id")).order_by():
            by_scope[entry["shard_scope"]][state] = entry["n"]
    for found in pauses:
        scope = by_scope[found.shard_scope]
        scope["paused_parts"] += 1
        scope["paused"] = scope["paused"] or found.part.kind == "scope"
    return [{"scope": registry.scope_name(value), **by_scope[value]} for value in sorted(by_scope)]


def _empty_scope() -> dict[str, Any]:
    return {
        "rows": 0,
        "shards": 0,
        "due_rows": 0,
        "failing_rows": 0,
        "highest_attempt": 0,
        "lag_seconds": 0.0,
        "oldest_age_seconds": 0.0,
        "dead_letters": 0,
        "held_shards": 0,
        "expired_shards": 0,
        "backing_off_shards": 0,
        "retry_due_shards": 0,
        "paused": False,
        "paused_parts": 0,
    }


def _worst_shards(model: type[OutboxBase], manager: Any) -> list[dict[str, Any]]:
    """The shards whose rows failed most often, worst first, each with its last error."""
    fields = model.shard_fields
    failing = manager.filter(attempts__gt=0).order_by("-attempts", "id")
    worst: dict[tuple[Any, ...], dict[str, Any]] = {}
    # A bounded read: enough rows to find WORST_SHARDS distinct shards in all but
    # pathological cases (one shard with many failing rows).
    for row in failing.values(*fields, "attempts", "last_error")[: WORST_SHARDS * 20]:
        key = tuple(row[field] for field in fields)
        if key in worst:
            continue
        shard = model.shard_key_of(key)
        worst[key] = {
            "scope": registry.scope_name(shard.shard_scope),
            "shard": str(shard),
            "attempts": row["attempts"],
            "last_error": row["last_error"][:500],
        }
        if len(worst) == WORST_SHARDS:
            break
    return list(worst.values())


def _age(now: datetime, then: datetime | None) -> float:
    return max((now - then).total_seconds(), 0.0) if then is not None else 0.0
