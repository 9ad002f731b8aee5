"""`manage.py outbox_prune_inbox`: delete the records of `inbox_receiver`s older than
OUTBOX_INBOX_RETENTION_SECONDS, in slices of `--slice-rows`, each its own statement (a
long backlog of records never holds locks for long). `drain_outboxes --loop` prunes the
same way on its heartbeat; this command is for drains run by Celery, Django Tasks or
cron."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from outbox.conf import outbox_settings
from outbox.inbox import PRUNE_SLICE_ROWS, inbox_databases, prune_inbox
from outbox.management.arguments import database_alias, whole_number


class Command(BaseCommand):
    help = "Delete inbox records older than OUTBOX_INBOX_RETENTION_SECONDS."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None,
            help="Database alias to use; default: every database the inbox migrates to.",
        )  # fmt: skip
        parser.add_argument(
            "--slice-rows", type=int, default=PRUNE_SLICE_ROWS,
            help=f"Records deleted per statement, 1 or more (default {PRUNE_SLICE_ROWS}).",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        whole_number("--slice-rows", options["slice_rows"], 1)
        alias = database_alias(options["database"])
        retention = outbox_settings.INBOX_RETENTION_SECONDS
        for using in [alias] if alias else inbox_databases():
            deleted = prune_inbox(using, rows=options["slice_rows"])
            self.stdout.write(
                f"Deleted {deleted} inbox record(s) older than {retention:g}s from {using}."
            )
