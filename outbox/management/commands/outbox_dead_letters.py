"""`manage.py outbox_dead_letters list|retry|discard`: inspect dead letters, send them
again (pending and due now, attempts reset, back in their shard's order), or delete
them. `retry` and `discard` need a selection (`--id`, `--message-id`, `--shard`,
`--category`) or `--all`, so that nothing is revived or deleted by accident."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.categories import registry
from outbox.exceptions import InvalidOutboxMessage
from outbox.management.arguments import database_alias, outbox_table
from outbox.models import OutboxBase, OutboxQuerySet, outbox_models

LIST_LIMIT = 1000


class Command(BaseCommand):
    help = "List, retry or discard outbox dead letters."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "retry", "discard"])
        parser.add_argument(
            "--table", action="append", default=[], metavar="APP_LABEL.MODEL",
            help="Only this outbox table (repeatable); default: every outbox table.",
        )  # fmt: skip
        parser.add_argument("--database", default=None, help="Database alias to use.")
        parser.add_argument("--id", type=int, nargs="+", action="extend", default=[])
        parser.add_argument("--message-id", type=uuid.UUID, nargs="+", action="extend",
                            default=[], help="Only these message ids.")  # fmt: skip
        parser.add_argument("--shard", type=int, action="append", default=[],
                            help="Only this shard_identifier (repeatable).")  # fmt: skip
        parser.add_argument("--category", action="append", default=[],
                            help="Only this category, by name or value (repeatable).")  # fmt: skip
        parser.add_argument("--all", action="store_true", help="Every dead letter selected.")
        parser.add_argument("--json", action="store_true", help="list: print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options["database"])
        narrowed = options["id"] or options["message_id"] or options["shard"] or options["category"]
        if options["action"] != "list" and not (narrowed or options["all"]):
            raise CommandError(
                "Say which dead letters: --id, --message-id, --shard, --category, or --all."
            )
        if options["json"] and options["action"] != "list":
            raise CommandError("--json goes with list.")
        selections = [self._select(model, alias, options) for model in self._tables(options)]
        if options["action"] == "list":
            self._list(selections, options["json"])
            return
        verb = options["action"]
        done = sum(rows.retry_dead() if verb == "retry" else rows.discard() for rows in selections)
        self.stdout.write(f"{'Retried' if verb == 'retry' else 'Discarded'} {done} dead letter(s).")

    def _tables(self, options: dict[str, Any]) -> list[type[OutboxBase]]:
        if not options["table"]:
            return outbox_models()
        return [outbox_table(label) for label in options["table"]]

    def _select(
        self, model: type[OutboxBase], alias: str | None, options: dict[str, Any]
    ) -> OutboxQuerySet[Any]:
        rows: OutboxQuerySet[Any] = model.objects.db_manager(alias).all().dead()
        if options["id"]:
            rows = rows.filter(id__in=options["id"])
        if options["message_id"]:
            rows = rows.filter(message_id__in=options["message_id"])
        if options["shard"]:
            rows = rows.filter(shard_identifier__in=options["shard"])
        if options["category"]:
            rows = rows.filter(category__in=[_category(name) for name in options["category"]])
        return cast("OutboxQuerySet[Any]", rows.order_by("id"))

    def _list(self, selections: list[OutboxQuerySet[Any]], as_json: bool) -> None:
        found = [_describe(row) for rows in selections for row in rows[:LIST_LIMIT]]
        if as_json:
            self.stdout.write(json.dumps(found, indent=2))
            return
        for row in found:
            error = row["last_error"].splitlines()[0] if row["last_error"] else ""
            self.stdout.write(
                f"{row['table']} #{row['id']} message {row['message_id']} shard {row['shard']} "
                f"{row['category']} "
                f"object {row['object_identifier']}: {row['attempts']} attempt(s), dead since "
                f"{row['dead_at']}: {error}"
            )
        self.stdout.write(f"{len(found)} dead letter(s).")


def _category(name: str) -> int:
    try:
        if name.lstrip("-").isdigit():
            return registry.category(int(name)).value
    except InvalidOutboxMessage as exc:
        raise CommandError(str(exc)) from None
    for category in registry.categories.values():
        if category.name == name.upper():
            return category.value
    raise CommandError(f"Unknown category {name!r}.")


def _describe(row: OutboxBase) -> dict[str, Any]:
    known = registry.categories.get(row.category)
    return {
        "table": row._meta.label,
        "id": row.id,
        "message_id": str(row.message_id),
        "shard": str(row.shard_key),
        "category": known.name if known is not None else row.category,
        "object_identifier": row.object_identifier,
        "attempts": row.attempts,
        "first_attempt_at": _iso(row.first_attempt_at),
        "last_attempt_at": _iso(row.last_attempt_at),
        "dead_at": _iso(row.dead_at),
        "last_error": row.last_error,
        "last_traceback": row.last_traceback,
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
