"""The figures of the admin dashboard: per outbox table and scope, the backlog, its lag,
the shards' lease states (held, backing off, retry due, expired: only the last one
stuck), failing rows and dead letters.

The page shows only the tables the user may view (the view or change permission on that
outbox model: `outbox.admin.leases.viewable_outboxes`). All figures come from
`outbox.health.snapshot.table_status` (what `manage.py outbox_status` reports: a fixed
number of aggregate queries per table, lease states read through `ShardLease.objects`);
this module only shapes them for the template, with a few bounded queries of its own:

- each count links to the change list filtered to exactly what it counts (`COUNT_LINKS`:
  the filters of `outbox.admin.filters` and the lease list's `outbox` column);
- `failing_shards`: the shards that need a look, worst first: leases a worker left to
  expire (stuck), leases held longer than the receiver deadline (a long batch or a hung
  call), and shards with live failing rows (backing off or retry due), each with its
  last error; dead letters are counted apart;
- `live_drains`: the drain processes alive in the table's database, as their beacons
  record them (`outbox.health.beacon`): each with its uptime, last beat, rows in the
  last minute and calls running, the longest call in the warning colour from
  `LONG_CALL_SECONDS` (failing when calls were given up at the timeout); none alive is
  said in the failing colour;
- `activity_chart`: the last hour of the drains of the table's database, as their beacons
  record it per minute (`outbox.models.drains.OutboxDrainMinute`): rows retired per minute
  as bars, the lag they sampled (oldest due message) as a line, drawn as inline SVG;
- `drain_activity`: what the leases tell of the drains besides (a lease renewed within
  the lease length, the last claim, how long retry-due shards have waited);
- `state_of`: ok / warning / failing for the colour and the word of each line; a
  paused scope's line says paused (in the warning colour) unless it is failing;
- `pauses`: what is paused in the table (`outbox.models.pause`), each with what the
  dashboard's resume form posts.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db import router
from django.db.models import Count, Max, Min
from django.urls import reverse
from django.utils import timezone

from outbox.admin.dead_letter_causes import url_name
from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.exceptions import InvalidOutboxMessage
from outbox.health.beacon import live_drains
from outbox.health.snapshot import table_status
from outbox.models import OutboxBase, ShardLease
from outbox.models.drains import recent_minutes

# Failing shards listed per table.
FAILING_SHARDS = 10

# A receiver call running this long is shown in the warning colour.
LONG_CALL_SECONDS = 5.0

# The activity chart: minutes shown, and its drawing area in SVG units (one bar a minute).
CHART_MINUTES = 60
CHART_WIDTH, CHART_HEIGHT, BAR_WIDTH = 600, 80, 10

# Dashboard column: key in a table_status scope entry.
SCOPE_COLUMNS = {
    "rows": "rows",
    "shards": "shards",
    "held": "held_shards",
    "expired": "expired_shards",
    "backing_off": "backing_off_shards",
    "retry_due": "retry_due_shards",
    "failing_rows": "failing_rows",
    "dead_letters": "dead_letters",
}


# Dashboard column: (list, query) of the change list showing exactly what it counts;
# list "rows" is the table's own change list, "leases" the shard lease list (filtered by
# the table's label too). "shards" (distinct shards with pending rows) has no list.
COUNT_LINKS: dict[str, tuple[str, dict[str, str]]] = {
    "rows": ("rows", {"delivery": "pending"}),
    "held": ("leases", {"state": "held"}),
    "expired": ("leases", {"state": "expired"}),
    "backing_off": ("leases", {"state": "backing_off"}),
    "retry_due": ("leases", {"state": "retry_due"}),
    "failing_rows": ("rows", {"delivery": "failing"}),
    "dead_letters": ("rows", {"delivery": "dead"}),
}

# The words of the states, shown beside their colour.
OK, WARNING, FAILING, PAUSED = "ok", "warning", "failing", "paused"


def dashboard_tables(
    models: Iterable[type[OutboxBase]], site_name: str = "admin"
) -> list[dict[str, Any]]:
    """The figures of each table of `models`, in that order."""
    drains: dict[str, list[dict[str, Any]]] = {}  # by database, read once each
    charts: dict[str, dict[str, Any]] = {}
    tables = [table_figures(model, site_name, drains) for model in models]
    for table in tables:
        alias = table["database"]
        if alias not in charts:
            charts[alias] = activity_chart(alias)
        table["activity"] = charts[alias]
    return tables


def table_figures(
    model: type[OutboxBase],
    site_name: str = "admin",
    drains: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    status = table_status(model)
    alias = status["database"]
    drains = {} if drains is None else drains
    if alias not in drains:
        drains[alias] = [drain_figures(drain) for drain in live_drains(alias)]
    lists = {
        "rows": reverse(f"{site_name}:{url_name(model._meta, 'changelist')}"),
        "leases": reverse(f"{site_name}:outbox_shardlease_changelist"),
    }
    scopes = [scope_figures(scope) for scope in status["scopes"]]
    for scope in scopes:
        scope["links"] = (
            count_links(model, lists, {"shard_scope": str(scope["value"])})
            if scope["value"] is not None
            else {}
        )
        scope["state"] = state_of(scope)
        if scope["paused"] and scope["state"] != FAILING:
            scope["state"] = PAUSED
    figures = {
        "label": status["table"],
        "verbose_name": model._meta.verbose_name_plural,
        "opts": model._meta,
        "database": alias,
        **{column: sum(scope[column] for scope in scopes) for column in SCOPE_COLUMNS},
        "lag_seconds": status.get("lag_seconds", 0.0),
        "lag": age(status.get("lag_seconds", 0.0)) if status.get("due_rows") else "",
        "scopes": scopes,
        "links": count_links(model, lists, {}),
        "failing_shards": failing_shards(model, alias, lists["rows"]),
        "causes": reverse(f"{site_name}:{url_name(model._meta, 'causes')}"),
        "drains": drain_activity(model, alias),
        "live_drains": drains[alias],
        "drains_recorded": bool(outbox_settings.DRAIN_BEACON_SECONDS),
        "regions": "region_name" in model.shard_fields,
        "pauses": [
            {
                **paused,
                "paused_for": age(
                    _seconds(timezone.now(), datetime.fromisoformat(paused["paused_at"]))
                ),
            }
            for paused in status["paused"]
        ],
    }
    figures["state"] = state_of(figures)
    return figures


def count_links(
    model: type[OutboxBase], lists: dict[str, str], extra: dict[str, str]
) -> dict[str, str]:
    """Column -> the URL of the change list filtered to exactly what that count counts."""
    links = {}
    # The lease list reads the leases of one database: a table whose leases live on
    # another (its own) has no list for its lease counts.
    leases_here = router.db_for_read(ShardLease) == router.db_for_read(model)
    for column, (which, query) in COUNT_LINKS.items():
        params = {**query, **extra}
        if which == "leases":
            if not leases_here:
                continue
            params = {"outbox": model._meta.label_lower, **params}
        links[column] = f"{lists[which]}?{urlencode(params)}"
    return links


def state_of(figures: dict[str, Any]) -> str:
    """failing: something is stuck or lost (an expired lease, dead letters); warning:
    messages are failing or waiting for a retry; ok otherwise."""
    if figures["expired"] or figures["dead_letters"]:
        return FAILING
    if figures["failing_rows"] or figures["backing_off"] or figures["retry_due"]:
        return WARNING
    return OK


def failing_shards(model: type[OutboxBase], alias: str, changelist: str) -> list[dict[str, Any]]:
    """The shards that need a look, worst first (see the module doc): stuck leases, then
    leases held past the receiver deadline, then shards with live failing rows by their
    highest attempt. Bounded: a few queries reading at most a few hundred rows."""
    now = timezone.now()
    leases = ShardLease.objects.using(alias).of(model)
    found: dict[tuple[str, int, int], dict[str, Any]] = {}

    def entry(key: tuple[str, int, int], **fields: Any) -> dict[str, Any]:
        region, scope, identifier = key
        query = {"shard_identifier": str(identifier), "shard_scope": str(scope)}
        if region and "region_name" in model.shard_fields:
            query["region_name"] = region
        shown = {
            "scope": registry.scope_name(scope),
            "shard": str(model.shard_key_of(_shard_values(model, key))),
            "attempts": 0,
            "last_error": "",
            "href": f"{changelist}?{urlencode(query)}",
            **fields,
        }
        return found.setdefault(key, shown)

    for lease in leases.abandoned().order_by("expires_at")[:FAILING_SHARDS]:
        entry(
            _lease_key(lease),
            state=FAILING,
            status=f"lease expired {age(_seconds(now, lease.expires_at))} ago, "
            f"held by {lease.holder or 'a worker'}: it died, hung or stopped renewing",
            rank=(0, 0),
        )
    deadline = timedelta(seconds=outbox_settings.RECEIVER_DEADLINE_SECONDS)
    long_held = leases.held().filter(claimed_at__lte=now - deadline).order_by("claimed_at")
    for lease in long_held[:FAILING_SHARDS]:
        entry(
            _lease_key(lease),
            state=WARNING,
            status=f"held {age(_seconds(now, lease.claimed_at))} by "
            f"{lease.holder or 'a worker'}, longer than the receiver deadline: "
            "a long batch or a hung call",
            rank=(1, 0),
        )
    fields = model.shard_fields
    rows = model._default_manager.using(alias).pending().filter(attempts__gt=0)
    failing = rows.order_by("-attempts", "id").values(*fields, "attempts", "last_error")
    failing_keys: list[tuple[str, int, int]] = []
    for row in failing[: FAILING_SHARDS * 20]:
        key = (row.get("region_name", ""), row["shard_scope"], row["shard_identifier"])
        if key in found and found[key]["attempts"]:
            continue
        shard = entry(key, state=WARNING, status="", rank=(2, -row["attempts"]))
        shard.update(attempts=row["attempts"], last_error=row["last_error"][:500])
        failing_keys.append(key)
        if len(failing_keys) == FAILING_SHARDS:
            break
    if failing_keys:
        states = leases.filter(shard_identifier__in={key[2] for key in failing_keys})
        by_key = {_lease_key(lease): lease for lease in states}
        for key in failing_keys:
            shard = found[key]
            if shard["status"]:
                continue
            lease = by_key.get(key)
            if lease is not None and lease.token is None and lease.expires_at > now:
                wait = age(_seconds(lease.expires_at, now))
                shard["status"] = f"backing off, retried in {wait}"
            elif lease is not None and lease.token is not None and lease.expires_at > now:
                shard["status"] = f"held by {lease.holder or 'a worker'}, retrying now"
            else:
                shard["status"] = "retry due: waiting for a drain"
    return sorted(found.values(), key=lambda shard: shard["rank"])[:FAILING_SHARDS]


def drain_activity(model: type[OutboxBase], alias: str) -> dict[str, Any]:
    """What the leases of one table tell of its drains (see the module doc)."""
    now = timezone.now()
    leases = ShardLease.objects.using(alias).of(model)
    held = leases.held().aggregate(n=Count("id"), holders=Count("holder", distinct=True))
    last_claim = leases.aggregate(at=Max("claimed_at"))["at"]
    retry_due = leases.retry_due().aggregate(n=Count("id"), since=Min("expires_at"))
    return {
        "held": held["n"],
        "holders": held["holders"],
        "lease_seconds": age(outbox_settings.LEASE_SECONDS),
        "last_claim": age(_seconds(now, last_claim)) if last_claim else "",
        "retry_due": retry_due["n"],
        "retry_due_for": age(_seconds(now, retry_due["since"])) if retry_due["since"] else "",
    }


def activity_chart(alias: str, now: datetime | None = None) -> dict[str, Any]:
    """The last CHART_MINUTES minutes of database `alias` (see the module doc): each
    minute's bar (its rows retired, scaled to the busiest minute), the lag line through
    the minutes recorded (scaled to the highest lag), and the totals the page states."""
    now = (now or timezone.now()).replace(second=0, microsecond=0)
    first = now - timedelta(minutes=CHART_MINUTES - 1)
    recorded = recent_minutes(alias, first)
    minutes = [first + timedelta(minutes=index) for index in range(CHART_MINUTES)]
    rows = [recorded.get(minute, (0, 0.0))[0] for minute in minutes]
    lags = [recorded[minute][1] if minute in recorded else None for minute in minutes]
    peak_rows = max(rows, default=0)
    peak_lag = max((lag for lag in lags if lag is not None), default=0.0)
    bars, points = [], []
    for index, (minute, count, lag) in enumerate(zip(minutes, rows, lags, strict=True)):
        height = round(CHART_HEIGHT * count / peak_rows, 1) if peak_rows else 0.0
        bars.append(
            {
                "x": index * BAR_WIDTH,
                "y": round(CHART_HEIGHT - height, 1),
                "height": height,
                "title": f"{_clock(minute)}: {count} rows retired"
                + (f", lag {age(lag)}" if lag is not None else ""),
            }
        )
        if lag is not None:
            y = CHART_HEIGHT - (CHART_HEIGHT * lag / peak_lag if peak_lag else 0.0)
            points.append(f"{index * BAR_WIDTH + BAR_WIDTH / 2:g},{round(y, 1):g}")
    return {
        "recorded": bool(recorded),
        "bars": bars,
        "lag_points": " ".join(points),
        "rows": sum(rows),
        "peak_rows": peak_rows,
        "peak_lag": age(peak_lag) if recorded else "",
        "last_lag": age(lags[-1]) if lags[-1] is not None else "",
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "minutes": CHART_MINUTES,
        "since": _clock(first),
        "until": _clock(now),
    }


def _clock(moment: datetime) -> str:
    """HH:MM in the current time zone."""
    return f"{timezone.localtime(moment) if timezone.is_aware(moment) else moment:%H:%M}"


def drain_figures(drain: dict[str, Any]) -> dict[str, Any]:
    """One live drain (`live_drains`) as the page shows it, with the state of its
    longest call: failing when calls were given up, warning from LONG_CALL_SECONDS."""
    longest = drain["longest_call_seconds"]
    state = ""
    if drain["stuck_calls"]:
        state = FAILING
    elif longest is not None and longest >= LONG_CALL_SECONDS:
        state = WARNING
    return {
        **drain,
        "up": age(drain["up_seconds"]),
        "beat": age(drain["beat_seconds_ago"]),
        "longest": age(longest) if longest is not None else "",
        "state": state,
    }


def _lease_key(lease: ShardLease) -> tuple[str, int, int]:
    return (lease.region_name, lease.shard_scope, lease.shard_identifier)


def _shard_values(model: type[OutboxBase], key: tuple[str, int, int]) -> list[Any]:
    named = dict(zip(("region_name", "shard_scope", "shard_identifier"), key, strict=True))
    return [named[field] for field in model.shard_fields]


def _seconds(later: datetime, earlier: datetime) -> float:
    return max((later - earlier).total_seconds(), 0.0)


def scope_figures(scope: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": scope["scope"],
        "value": scope_value(scope["scope"]),
        **{column: scope.get(key, 0) for column, key in SCOPE_COLUMNS.items()},
        "lag_seconds": scope.get("lag_seconds", 0.0),
        "lag": age(scope["lag_seconds"]) if scope.get("due_rows") else "",
        "paused": scope.get("paused", False),
        "paused_parts": scope.get("paused_parts", 0),
    }


def scope_value(name: str) -> int | None:
    """The stored integer of a scope named by table_status (for changelist filters)."""
    try:
        return int(registry.scope_by_name(name).value)
    except InvalidOutboxMessage:
        return None


def age(seconds: float) -> str:
    """A short human age: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    whole = int(seconds)
    for unit, size, minor, minor_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            return f"{whole // size} {unit} {whole % size // minor_size} {minor}"
    return f"{whole} s"
