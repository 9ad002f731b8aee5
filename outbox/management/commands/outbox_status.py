"""`manage.py outbox_status [--json]`: the backlog of every outbox table."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.models import outbox_models
from outbox.status import table_status


class Command(BaseCommand):
    help = "Show the outbox backlog per table and scope."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        parser.add_argument("--database", default=None, help="Database alias to inspect.")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias is not None and alias not in settings.DATABASES:
            raise CommandError(
                f"Unknown database {alias!r} (DATABASES has {list(settings.DATABASES)})."
            )
        tables = [table_status(model, options["database"]) for model in outbox_models()]
        if options["json"]:
            self.stdout.write(json.dumps(tables, indent=2))
            return
        for table in tables:
            self.stdout.write(
                f"{table['table']} ({table['database']}): {table['rows']} rows, "
                f"{table['due_rows']} due, {table['failing_rows']} failing "
                f"(max attempts {table['max_attempts']}), "
                f"oldest {table['oldest_age_seconds']:.0f}s, "
                f"{table['leased_shards']} shards leased, "
                f"{table['backing_off_shards']} backing off, "
                f"{table['expired_shards']} expired"
            )
            for scope in table["scopes"]:
                self.stdout.write(
                    f"    {scope['scope']}: {scope['rows']} rows in {scope['shards']} shards"
                )
