"""The thresholds that turn the readings into problems, for probes and monitoring: limits
over `outbox.health.snapshot` and, on PostgreSQL, `outbox.health.vacuum`.

`problems()` returns what is wrong, in words (empty when healthy); `manage.py
outbox_status` exits non-zero on them (its `--max-...` options, one per `Thresholds`
field), and `outbox.integrations.health_check.OutboxHealthCheck` reports them to
django-health-check. `backlog()` is the one-line figure the drain loop's heartbeat logs,
`backlog_figures()` the same as numbers.

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
from outbox.health.beacon import attach_drains
from outbox.health.snapshot import known_database, table_status
from outbox.health.vacuum import attach, describe_holder
from outbox.models import OutboxBase, outbox_models


@dataclass(frozen=True)
class Thresholds:
    """Limits past which the outboxes are unhealthy; None: not checked. Each is 0 or
    more: seconds for the lag, whole numbers for the counts (InvalidThreshold else).

    `max_expired` counts the shards whose worker's lease ran out (a dead worker's), not
    those whose back-off is over and which wait for a drain (`retry_due_shards`: a
    routine retry; with no drain running, the lag grows and `max_lag_seconds` sees it).

    The vacuum limits apply on PostgreSQL only (elsewhere there is nothing to check):
    `max_xmin_age_seconds` over the age of the oldest transaction holding back vacuum in
    a database (one whose age is hidden, a replication slot's or another role's, is not
    judged), `max_xmin_xids` over its age in transaction ids (always known),
    `max_dead_tuples` over the dead tuples of each outbox table and of the lease
    table.

    `min_drains` is a floor, not a limit: fewer live drain processes recorded in a
    table's database (`outbox.health.beacon`; read by `statuses(drains=True)`, tables
    without that reading are not judged) is a problem, once per database."""

    max_lag_seconds: float | None = None
    max_dead: int | None = None
    max_expired: int | None = None
    max_xmin_age_seconds: float | None = None
    max_xmin_xids: int | None = None
    max_dead_tuples: int | None = None
    min_drains: int | None = None

    def __post_init__(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if value is None:
                continue
            seconds = limit.name.endswith("_seconds")
            kind = Real if seconds else Integral
            if isinstance(value, kind) and not isinstance(value, bool) and float(value) >= 0:
                continue  # NaN is not >= 0
            what = "a number of seconds" if seconds else "a whole number"
            raise InvalidThreshold(
                f"Thresholds.{limit.name} must be {what}, 0 or more (or None: not "
                f"checked), not {value!r}"
            )


def statuses(
    using: str | None = None,
    models: Sequence[type[OutboxBase]] | None = None,
    *,
    vacuum: bool = True,
    drains: bool = False,
) -> list[dict[str, Any]]:
    """`table_status` of every outbox table (or of `models`), each with its "vacuum"
    reading (`outbox.health.vacuum.attach`: None off PostgreSQL) unless `vacuum` is
    False, and with `drains` the live drain processes of its database ("drains",
    `outbox.health.beacon.attach_drains`)."""
    alias = known_database(using)
    chosen = list(models or outbox_models())
    tables = [table_status(model, alias) for model in chosen]
    if vacuum:
        attach(tables, chosen)
    if drains:
        attach_drains(tables)
    return tables


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
    return found + _vacuum_problems(tables, thresholds) + _drain_problems(tables, thresholds)


def _drain_problems(tables: Sequence[dict[str, Any]], thresholds: Thresholds) -> list[str]:
    """Fewer live drains than `min_drains`, once per database read."""
    floor = thresholds.min_drains
    if floor is None:
        return []
    found = []
    alive = {table["database"]: len(table["drains"]) for table in tables if "drains" in table}
    for database, count in alive.items():
        if count < floor:
            found.append(f"{database}: {count or 'no'} drain process(es) alive, fewer than {floor}")
    return found


def _vacuum_problems(tables: Sequence[dict[str, Any]], thresholds: Thresholds) -> list[str]:
    """The vacuum limits: each table's dead tuples, and once per database the lease
    table's and the oldest xmin's age. Tables without a reading are not judged."""
    found: list[str] = []
    databases = set()
    for table in tables:
        vacuum, database = table.get("vacuum"), table["database"]
        if vacuum is None:
            continue
        checked = [(table["table"], vacuum["table"])]
        if database not in databases:
            databases.add(database)
            checked.append(("outbox.ShardLease", vacuum["lease_table"]))
            found += _xmin_problems(database, vacuum["oldest_xmin"], thresholds)
        limit = thresholds.max_dead_tuples
        for label, figures in checked:
            dead = figures["dead_tuples"] or 0
            if limit is not None and dead > limit:
                found.append(
                    f"{label} ({database}): {dead} dead tuples in {figures['table']}, over {limit}"
                )
    return found


def _xmin_problems(
    database: str, holder: dict[str, Any] | None, thresholds: Thresholds
) -> list[str]:
    """The oldest xmin past its age in seconds (when known) or in transaction ids."""
    if holder is None:
        return []
    seconds, xids = holder["age_seconds"] or 0.0, holder["xid_age"]
    max_seconds, max_xids = thresholds.max_xmin_age_seconds, thresholds.max_xmin_xids
    passed = []
    if max_seconds is not None and seconds > max_seconds:  # an unknown age passes none
        passed.append(f"{max_seconds:g}s")
    if max_xids is not None and xids > max_xids:
        passed.append(f"{max_xids} xids")
    if not passed:
        return []
    return [
        f"{database}: the oldest transaction holding back vacuum is over "
        f"{' and '.join(passed)}: {describe_holder(holder)}"
    ]


def check(using: str | None = None, thresholds: Thresholds | None = None) -> list[str]:
    """The health check function: the problems of every outbox table (empty: healthy).
    The live drains are read only where `min_drains` is set."""
    thresholds = thresholds or Thresholds()
    tables = statuses(using, drains=thresholds.min_drains is not None)
    return problems(tables, thresholds)


def backlog(using: str | None = None) -> str:
    """'<rows> rows (<due> due) in <shards> shards, lag <s>s, <dead> dead' over all
    tables: the heartbeat's backlog figure."""
    return describe_backlog(backlog_figures(using))


def backlog_figures(using: str | None = None) -> dict[str, Any]:
    """The backlog over all tables as numbers: `rows`, `due_rows`, `shards`,
    `lag_seconds`, `dead_letters` (the heartbeat logs them as fields of its record)."""
    tables = statuses(using, vacuum=False)
    return {
        "rows": sum(table["rows"] for table in tables),
        "due_rows": sum(table["due_rows"] for table in tables),
        "shards": sum(scope["shards"] for table in tables for scope in table["scopes"]),
        "lag_seconds": max((table["lag_seconds"] for table in tables), default=0.0),
        "dead_letters": sum(table["dead_letters"] for table in tables),
    }


def describe_backlog(figures: dict[str, Any]) -> str:
    """`backlog_figures` in words, as `backlog` gives them."""
    return (
        f"{figures['rows']} rows ({figures['due_rows']} due) in {figures['shards']} shards, "
        f"lag {figures['lag_seconds']:.1f}s, {figures['dead_letters']} dead"
    )
