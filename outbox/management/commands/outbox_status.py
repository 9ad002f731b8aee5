"""`manage.py outbox_status`: the backlog of every outbox table, for people and probes.

Per table and scope: rows, shards, due rows, lag (the oldest due row's age), failing
rows (per table with the highest attempt among them and, when set, the limit
`OUTBOX_MAX_ATTEMPTS`), dead letters, shards held / backing off / retry due (a back-off
over, waiting for a drain: routine) / expired (a worker's lease ran out: stuck), and the
worst shards with their last error; what is paused (a scope line ends in "PAUSED" when
the whole scope is, and one "paused:" line per pause names the part); on PostgreSQL, vacuum health
(`outbox.health.vacuum`): each table's dead tuples and last vacuum, and per database the
lease table's and the oldest transaction holding back vacuum (elsewhere it says "not
available"). `--json` prints the same as JSON. Thresholds (`--max-lag`, `--max-dead`,
`--max-expired`: expired leases only, never a retry due; `--max-xmin-age`,
`--max-xmin-xids`, `--max-dead-tuples`: PostgreSQL only) make it exit with status 6 when
passed, naming what passed them, so it serves as a monitoring check or a probe.
Once per database, the drain processes alive there (`outbox.health.beacon`: host:pid,
kind, uptime, last beat, rows in the last minute, calls running and the longest), or
"no drain alive"; `--min-drains N` exits with status 6 when fewer are.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from outbox.conf import outbox_settings
from outbox.exceptions import InvalidThreshold
from outbox.health.beacon import describe_drain
from outbox.health.thresholds import Thresholds, problems, statuses
from outbox.health.vacuum import describe_holder, describe_table
from outbox.management import exit_codes
from outbox.management.arguments import database_alias
from outbox.shown_text import one_line

# How much of a worst shard's last error a line shows.
WORST_ERROR_CHARS = 200

# Option name, Thresholds field.
THRESHOLDS = (
    ("max_lag", "max_lag_seconds"),
    ("max_dead", "max_dead"),
    ("max_expired", "max_expired"),
    ("max_xmin_age", "max_xmin_age_seconds"),
    ("max_xmin_xids", "max_xmin_xids"),
    ("max_dead_tuples", "max_dead_tuples"),
    ("min_drains", "min_drains"),
)


class Command(BaseCommand):
    help = "Show the outbox backlog per table and scope; exit 6 past a threshold."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        parser.add_argument("--database", default=None, help="Database alias to inspect.")
        parser.add_argument(
            "--max-lag", type=float, metavar="SECONDS", help="Fail when the lag is over this."
        )
        parser.add_argument(
            "--max-dead", type=int, metavar="N", help="Fail when there are more dead letters."
        )
        parser.add_argument(
            "--max-expired",
            type=int,
            metavar="N",
            help="Fail when more shards have an expired lease (stuck: a dead worker's).",
        )
        parser.add_argument(
            "--max-xmin-age",
            type=float,
            metavar="SECONDS",
            help="PostgreSQL: fail when the oldest transaction holding back vacuum is older.",
        )
        parser.add_argument(
            "--max-xmin-xids",
            type=int,
            metavar="N",
            help="PostgreSQL: the same, in transaction ids (also a slot's or another role's).",
        )
        parser.add_argument(
            "--max-dead-tuples",
            type=int,
            metavar="N",
            help="PostgreSQL: fail when an outbox table or the lease table has more dead tuples.",
        )
        parser.add_argument(
            "--min-drains",
            type=int,
            metavar="N",
            help="Fail when fewer drain processes are alive in a database (see "
            "OUTBOX_DRAIN_BEACON_SECONDS).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options["database"])
        for name, _ in THRESHOLDS:
            if options[name] is not None and options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must not be negative.")
        try:
            thresholds = Thresholds(**{field: options[name] for name, field in THRESHOLDS})
        except InvalidThreshold as exc:  # NaN: argparse's float takes it
            raise CommandError(str(exc)) from exc
        tables = statuses(alias, drains=True)
        if options["json"]:
            self.stdout.write(json.dumps(tables, indent=2))
        else:
            for table in tables:
                self._show(table)
            self._show_databases(tables)
        found = problems(tables, thresholds)
        if found:
            raise CommandError("; ".join(found), returncode=exit_codes.UNHEALTHY)

    def _show(self, table: dict[str, Any]) -> None:
        self.stdout.write(
            f"{table['table']} ({table['database']}): {table['rows']} rows, "
            f"{table['due_rows']} due, lag {table['lag_seconds']:.0f}s, "
            f"{table['failing_rows']} failing ({_attempts(table)}), "
            f"{table['dead_letters']} dead, oldest {table['oldest_age_seconds']:.0f}s, "
            f"{table['leased_shards']} shards leased, "
            f"{table['backing_off_shards']} backing off, "
            f"{table['retry_due_shards']} retry due, "
            f"{table['expired_shards']} expired"
        )
        for scope in table["scopes"]:
            self.stdout.write(
                f"    {scope['scope']}: {scope['rows']} rows in {scope['shards']} shards, "
                f"{scope['due_rows']} due, lag {scope['lag_seconds']:.0f}s, "
                f"{scope['failing_rows']} failing, {scope['dead_letters']} dead, "
                f"held {scope['held_shards']}, backing off {scope['backing_off_shards']}, "
                f"retry due {scope['retry_due_shards']}, expired {scope['expired_shards']}"
                f"{', PAUSED' if scope['paused'] else ''}"
            )
        for paused in table["paused"]:
            by = f" by {paused['paused_by']}" if paused["paused_by"] else ""
            reason = (
                f": {one_line(paused['reason'], WORST_ERROR_CHARS)}" if paused["reason"] else ""
            )
            self.stdout.write(
                f"    paused: {paused['part']} since {paused['paused_at']}{by}{reason}"
            )
        vacuum = table["vacuum"]
        self.stdout.write(
            f"    vacuum: {describe_table(vacuum['table'])}"
            if vacuum
            else f"    vacuum: not available on {connections[table['database']].display_name} "
            "(PostgreSQL only)"
        )
        for shard in table["worst_shards"]:
            # One escaped line: a receiver's text could forge lines or send escapes.
            error = one_line(shard["last_error"].strip(), WORST_ERROR_CHARS)
            self.stdout.write(
                f"    worst: shard {shard['shard']} ({shard['scope']}), "
                f"{shard['attempts']} attempts: {error}"
            )

    def _show_databases(self, tables: list[dict[str, Any]]) -> None:
        """Once per database: its live drains; once per PostgreSQL database: the oldest
        xmin's holder and the lease table."""
        self._show_drains(tables)
        shown = set()
        for table in tables:
            vacuum, database = table["vacuum"], table["database"]
            if not vacuum or database in shown:
                continue
            shown.add(database)
            holder = vacuum["oldest_xmin"]
            self.stdout.write(
                f"{database}: autovacuum {'on' if vacuum['autovacuum'] else 'OFF'}, "
                "oldest transaction holding back vacuum: "
                f"{describe_holder(holder) if holder else 'none'}"
            )
            self.stdout.write(f"    lease table {describe_table(vacuum['lease_table'])}")

    def _show_drains(self, tables: list[dict[str, Any]]) -> None:
        """Once per database: its live drains, one line each, or "no drain alive"."""
        shown: set[str] = set()
        for table in tables:
            database, drains = table["database"], table["drains"]
            if database in shown:
                continue
            shown.add(database)
            if not drains:
                self.stdout.write(f"{database}: no drain alive{_unrecorded()}")
                continue
            self.stdout.write(f"{database}: {len(drains)} drain(s) alive")
            for drain in drains:
                self.stdout.write(f"    drain {one_line(describe_drain(drain), 400)}")


def _unrecorded() -> str:
    """Why no drain may be listed although one runs: this process records none."""
    if outbox_settings.DRAIN_BEACON_SECONDS:
        return ""
    return (
        " (none recorded: OUTBOX_DRAIN_BEACON_SECONDS is 0 here; drains record themselves"
        " only where it is above 0)"
    )


def _attempts(table: dict[str, Any]) -> str:
    """The highest attempt among the pending rows, and the limit when one is set: the
    one is what happened, the other what is allowed."""
    shown = f"highest attempt {table['highest_attempt']}"
    if table["attempt_limit"]:
        shown += f", limit OUTBOX_MAX_ATTEMPTS={table['attempt_limit']}"
    return shown
