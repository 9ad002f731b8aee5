"""`manage.py outbox_status`: the backlog of every outbox table, for people and probes.

Per table and scope: rows, shards, due rows, lag (the oldest due row's age), failing
rows, dead letters, shards held / backing off / retry due (a back-off over, waiting for
a drain: routine) / expired (a worker's lease ran out: stuck), and the worst shards with
their last error. `--json` prints the same as JSON. Thresholds (`--max-lag`,
`--max-dead`, `--max-expired`: expired leases only, never a retry due) make it exit with
status 6 when passed, naming what passed them, so it serves as a monitoring check or a
probe.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.exceptions import InvalidThreshold
from outbox.health import Thresholds, problems, statuses
from outbox.management import exit_codes
from outbox.management.arguments import database_alias


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

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options["database"])
        for name in ("max_lag", "max_dead", "max_expired"):
            if options[name] is not None and options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must not be negative.")
        try:
            thresholds = Thresholds(options["max_lag"], options["max_dead"], options["max_expired"])
        except InvalidThreshold as exc:  # NaN: argparse's float takes it
            raise CommandError(str(exc)) from exc
        tables = statuses(alias)
        if options["json"]:
            self.stdout.write(json.dumps(tables, indent=2))
        else:
            for table in tables:
                self._show(table)
        found = problems(tables, thresholds)
        if found:
            raise CommandError("; ".join(found), returncode=exit_codes.UNHEALTHY)

    def _show(self, table: dict[str, Any]) -> None:
        self.stdout.write(
            f"{table['table']} ({table['database']}): {table['rows']} rows, "
            f"{table['due_rows']} due, lag {table['lag_seconds']:.0f}s, "
            f"{table['failing_rows']} failing (max attempts {table['max_attempts']}), "
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
            )
        for shard in table["worst_shards"]:
            error = shard["last_error"].splitlines()[-1] if shard["last_error"] else ""
            self.stdout.write(
                f"    worst: shard {shard['shard']} ({shard['scope']}), "
                f"{shard['attempts']} attempts: {error[:200]}"
            )
