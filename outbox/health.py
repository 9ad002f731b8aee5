"""Health of the outboxes, for probes and monitoring: thresholds over `outbox.status`.

`problems()` returns what is wrong, in words (empty when healthy); `manage.py
outbox_status --max-lag/--max-dead/--max-expired` exits non-zero on them, and
`outbox.integrations.health_check.OutboxHealthCheck` reports them to
django-health-check. `backlog()` is the one-line figure the drain loop's heartbeat logs.

They refuse what `outbox_status` refuses: a database alias DATABASES does not have
(`outbox.exceptions.UnknownDatabase`, naming it and the configured ones), and a
threshold below 0 or not a number (`outbox.exceptions.InvalidThreshold`, a ValueError,
as the Thresholds is made).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Any

from outbox.exceptions import InvalidThreshold
from outbox.models import OutboxBase, outbox_models
from outbox.status import known_database, table_status


@dataclass(frozen=True)
class Thresholds:
    """Limits past which the outboxes are unhealthy; None: not checked. Each is 0 or
    more: seconds for the lag, whole numbers for the counts (InvalidThreshold else).

    `max_expired` counts the shards whose worker's lease ran out (a dead worker's), not
    those whose back-off is over and which wait for a drain (`retry_due_shards`: a
    routine retry; with no drain running, the lag grows and `max_lag_seconds` sees it)."""

    max_lag_seconds: float | None = None
    max_dead: int | None = None
    max_expired: int | None = None

    def __post_init__(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if value is None:
                continue
            seconds = limit.name == "max_lag_seconds"
            kind = Real if seconds else Integral
            if isinstance(value, kind) and not isinstance(value, bool) and float(value) >= 0:
                continue  # NaN is not >= 0
            what = "a number of seconds" if seconds else "a whole number"
            raise InvalidThreshold(
                f"Thresholds.{limit.name} must be {what}, 0 or more (or None: not "
                f"checked), not {value!r}"
            )


def statuses(
    using: str | None = None, models: Sequence[type[OutboxBase]] | None = None
) -> list[dict[str, Any]]:
    """`table_status` of every outbox table (or of `models`)."""
    alias = known_database(using)
    return [table_status(model, alias) for model in models or outbox_models()]


def problems(tables: Sequence[dict[str, Any]], thresholds: Thresholds) -> list[str]:
    """What passes the thresholds, one sentence per table and limit."""
    found = []
    for table in tables:
        name = f"{table['table']} ({table['database']})"
        lag, dead, expired = table["lag_seconds"], table["dead_letters"], table["expired_shards"]
        if thresholds.max_lag_seconds is not None and lag > thresholds.max_lag_seconds:
            found.append(f"{name}: lag {lag:.0f}s over {thresholds.max_lag_seconds:g}s")
        if thresholds.max_dead is not None and dead > thresholds.max_dead:
            found.append(f"{name}: {dead} dead letter(s), over {thresholds.max_dead}")
        if thresholds.max_expired is not None and expired > thresholds.max_expired:
            found.append(
                f"{name}: {expired} shard(s) with an expired lease (a dead worker's), "
                f"over {thresholds.max_expired}"
            )
    return found


def check(using: str | None = None, thresholds: Thresholds | None = None) -> list[str]:
    """The health check function: the problems of every outbox table (empty: healthy)."""
    return problems(statuses(using), thresholds or Thresholds())


def backlog(using: str | None = None) -> str:
    """'<rows> rows (<due> due) in <shards> shards, lag <s>s, <dead> dead' over all
    tables: the heartbeat's backlog figure."""
    tables = statuses(using)
    rows = sum(table["rows"] for table in tables)
    due = sum(table["due_rows"] for table in tables)
    shards = sum(scope["shards"] for table in tables for scope in table["scopes"])
    lag = max((table["lag_seconds"] for table in tables), default=0.0)
    dead = sum(table["dead_letters"] for table in tables)
    return f"{rows} rows ({due} due) in {shards} shards, lag {lag:.1f}s, {dead} dead"
