"""`manage.py outbox_pause pause|resume|list`: stop delivering a scope, a shard or a
category, and start again where it stopped (`outbox.models.pause`).

`pause` and `resume` name one part: `--scope`, `--scope` with `--shard` (and `--region`
on a table with regions), or `--category`; on every outbox table, or those `--table`
names. A paused part keeps its rows and their order; no drain and no flush after commit
claims it until it is resumed. Both write the admin log as the admin does (one entry per
table paused or resumed), under the user `--user` names, or, without it, the Django user
whose username is the OS login name, as `outbox_dead_letters` does: where there is none,
the command acts and warns that no entry was written. `--no-audit` writes none."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router, transaction

from outbox.backends.select import notify_listeners
from outbox.management.arguments import (
    add_audit_arguments,
    audit_user,
    category_value,
    database_alias,
    outbox_table,
    scope_value,
    shard_identifiers,
)
from outbox.models import OutboxBase, OutboxPause, PausedPart, outbox_models
from outbox.models.audit import record_pause
from outbox.models.pause import pause, resume

HOW = "by outbox_pause"


class Command(BaseCommand):
    help = "Pause, resume or list paused scopes, shards and categories of the outboxes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "list"])
        parser.add_argument("--scope", help="The scope, by name or value.")
        parser.add_argument("--shard", type=int, help="With --scope: only this shard_identifier.")
        parser.add_argument("--region", default="", help="With --shard, on a table with "
                            "regions: the shard's region (default: every region).")  # fmt: skip
        parser.add_argument("--category", help="The category, by name or value (its scope "
                            "is implied). Holds each shard at its first row of it.")  # fmt: skip
        parser.add_argument("--table", action="append", default=[], metavar="APP_LABEL.MODEL",
                            help="Only this outbox table (repeatable); default: all.")  # fmt: skip
        parser.add_argument("--database", default=None,
                            help="Database alias to use; default: each table's own.")  # fmt: skip
        parser.add_argument("--reason", default="", help="pause: why, for the record.")
        parser.add_argument("--json", action="store_true", help="list: print JSON.")
        add_audit_arguments(parser, "pause, resume")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options["database"])
        tables = [outbox_table(label) for label in options["table"]] or outbox_models()
        if options["action"] == "list":
            self._list(tables, alias, options["json"])
            return
        part = _part(options)
        user_id, unaudited = audit_user(options["user"], no_audit=options["no_audit"])
        if unaudited:
            self.stderr.write(self.style.WARNING(unaudited))
        for model in tables:
            using = alias or router.db_for_write(model)
            with transaction.atomic(using=using):
                if options["action"] == "pause":
                    done = self._pause(model, part, using, user_id, options)
                else:
                    done = self._resume(model, part, using, user_id)
            self.stdout.write(f"{done} {part} of {model._meta.label}.")

    def _pause(
        self,
        model: type[OutboxBase],
        part: PausedPart,
        using: str,
        user_id: Any,
        options: dict[str, Any],
    ) -> str:
        paused_by = options["user"] or ""
        made, new = pause(model, part, using=using, paused_by=paused_by, reason=options["reason"])
        if not new:
            return "Already paused:"
        if user_id is not None:
            record_pause(user_id, made, resumed=False, how=HOW)
        return "Paused"

    def _resume(self, model: type[OutboxBase], part: PausedPart, using: str, user_id: Any) -> str:
        found = resume(model, part, using=using)
        if user_id is not None:
            for resumed in found:
                record_pause(user_id, resumed, resumed=True, how=HOW)
        if found:
            notify_listeners(model, using)  # idle loops look again at once
        return "Resumed" if found else "Was not paused:"

    def _list(self, tables: list[type[OutboxBase]], alias: str | None, as_json: bool) -> None:
        listed = []
        for model in tables:
            pauses = OutboxPause.objects.using(alias or router.db_for_read(model)).of(model)
            listed += list(pauses.order_by("paused_at", "id"))
        if as_json:
            self.stdout.write(json.dumps([_as_dict(found) for found in listed], indent=2))
            return
        if not listed:
            self.stdout.write("Nothing is paused.")
        for found in listed:
            by = f" by {found.paused_by}" if found.paused_by else ""
            reason = f": {found.reason}" if found.reason else ""
            self.stdout.write(
                f"{found.outbox} {found.part} paused since {found.paused_at:%Y-%m-%d %H:%M:%S}"
                f"{by}{reason}"
            )


def _part(options: dict[str, Any]) -> PausedPart:
    """The part `--scope`, `--shard`, `--region` and `--category` name; exactly one."""
    scope, shard, category = options["scope"], options["shard"], options["category"]
    if category is not None:
        if scope is not None or shard is not None:
            raise CommandError("--category names a part on its own: leave --scope and --shard out.")
        return PausedPart.of_category(category_value(category))
    if scope is None:
        raise CommandError("Say what to pause or resume: --scope (with --shard), or --category.")
    if shard is None:
        if options["region"]:
            raise CommandError("--region goes with --shard.")
        return PausedPart(scope_value(scope))
    shard_identifiers("--shard", [shard])
    # No --region: the shard in every region (a table without regions has one).
    return PausedPart(scope_value(scope), shard, options["region"] or None)


def _as_dict(found: OutboxPause) -> dict[str, Any]:
    return {
        "table": found.outbox,
        "kind": found.part.kind,
        "part": str(found.part),
        "shard_scope": found.shard_scope,
        "shard_identifier": found.shard_identifier,
        "region_name": found.region_name,
        "category": found.category,
        "paused_at": found.paused_at.isoformat(),
        "paused_by": found.paused_by,
        "reason": found.reason,
    }
