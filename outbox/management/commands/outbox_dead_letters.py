"""`manage.py outbox_dead_letters list|retry|discard`: inspect dead letters, send them
again (pending and due now, attempts reset, back in their shard's order), or delete
them. `retry` and `discard` need a selection (`--id`, `--message-id`, `--shard`,
`--category`, `--cause`) or `--all`, so that nothing is revived or deleted by accident.
`list --group` shows them grouped by cause (receiver, exception type, normalised
message: see `outbox.models.causes`), each cause with the key `--cause` selects.

`retry` and `discard` write the admin log as the admin's actions do: one entry per dead
letter (`outbox.models.audit`), under the user `--user` names. Without `--user`, the
Django user whose username is the OS login name (`getpass.getuser()`: `$LOGNAME`,
`$USER`, then the password database), where there is one: an operator logged in under
their own name is recorded without a flag. Where there is none (a container running as
`root`), the command still acts, and warns that no entry was written and how to write
one: the audit never stands between an operator and a retry at 3 a.m., nor breaks a
script written before it. `--no-audit` writes none and says nothing. An unknown `--user`
is refused before anything changes."""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Iterator
from typing import Any, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.categories import registry
from outbox.management.arguments import (
    add_audit_arguments,
    audit_user,
    category_value,
    database_alias,
    outbox_table,
    shard_identifiers,
    whole_number,
)
from outbox.models import OutboxBase, OutboxQuerySet, outbox_models
from outbox.models.audit import BY_CAUSE, BY_COMMAND, Audit, audited_chunks
from outbox.models.causes import KEY_LENGTH, is_cause_key
from outbox.models.dead_letter_groups import (
    DeadLetterGroup,
    Grouping,
    cause_ids,
    group_dead_letters,
    in_slices,
)
from outbox.models.outbox import BIGINT_MAX
from outbox.shown_text import one_line

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
        parser.add_argument("--cause", type=_cause_key, action="append", default=[],
                            metavar="KEY", help="Only the dead letters of this cause, by the "
                            "key list --group shows (repeatable).")  # fmt: skip
        parser.add_argument("--all", action="store_true", help="Every dead letter selected.")
        parser.add_argument("--group", action="store_true",
                            help="list: group the dead letters by cause.")  # fmt: skip
        parser.add_argument("--json", action="store_true", help="list: print JSON.")
        add_audit_arguments(
            parser, "retry, discard", per=", one entry per dead letter",
            note=" (the audit never blocks a retry, nor an older script)",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        _check_numbers(options)
        alias = database_alias(options["database"])
        if options["action"] != "list" and not (_narrowed(options) or options["all"]):
            raise CommandError(
                "Say which dead letters: --id, --message-id, --shard, --category, --cause, "
                "or --all."
            )
        if options["json"] and options["action"] != "list":
            raise CommandError("--json goes with list.")
        if options["group"] and options["action"] != "list":
            raise CommandError("--group goes with list.")
        if (options["user"] is not None or options["no_audit"]) and options["action"] == "list":
            raise CommandError("--user and --no-audit go with retry or discard.")
        # Before anything is read or changed: an unknown --user is refused.
        auditor, unaudited = self._auditor(options) if options["action"] != "list" else (None, "")
        selections = [self._select(model, alias, options) for model in self._tables(options)]
        if options["group"]:
            self._list_groups(selections, set(options["cause"]), options["json"])
            return
        if options["action"] == "list":
            if options["cause"]:
                selections = self._of_causes(selections, set(options["cause"]), "list")
            self._list(selections, options["json"])
            return
        verb = options["action"]
        if unaudited:
            self.stderr.write(self.style.WARNING(unaudited))
        done = sum(
            _change(rows, verb == "discard", auditor, reach)
            for rows, reach in self._reached(selections, options["cause"])
        )
        self.stdout.write(f"{'Retried' if verb == 'retry' else 'Discarded'} {done} dead letter(s).")

    def _auditor(self, options: dict[str, Any]) -> tuple[Any, str]:
        """The pk of the user whose admin log entries retry or discard write (None: no
        entry), and the warning to give when none could be found. Refuses an unknown
        `--user`."""
        return audit_user(options["user"], no_audit=options["no_audit"])

    def _reached(
        self, selections: list[OutboxQuerySet[Any]], causes: list[str]
    ) -> Iterator[tuple[OutboxQuerySet[Any], str]]:
        """The selections to change, each with how the admin log says they were reached:
        by the command, and as dead letters of which cause (each cause on its own)."""
        if not causes:
            for rows in selections:
                yield rows, BY_COMMAND
            return
        for key in dict.fromkeys(causes):  # in the order given, each once
            for part in self._of_causes(selections, {key}, "retry"):
                yield part, f"{BY_COMMAND} {BY_CAUSE} {key}"

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
            rows = rows.filter(category__in=[category_value(name) for name in options["category"]])
        return cast("OutboxQuerySet[Any]", rows.order_by("id"))

    def _of_causes(
        self, selections: list[OutboxQuerySet[Any]], keys: set[str], action: str
    ) -> list[OutboxQuerySet[Any]]:
        """Each selection narrowed to the dead letters of these causes, in slices of ids."""
        limit = LIST_LIMIT if action == "list" else None
        return [
            part for rows in selections for part in in_slices(rows, cause_ids(rows, keys, limit))
        ]

    def _list(self, selections: list[OutboxQuerySet[Any]], as_json: bool) -> None:
        found = [_describe(row) for rows in selections for row in rows[:LIST_LIMIT]]
        if as_json:
            self.stdout.write(json.dumps(found, indent=2))
            return
        for row in found:
            # One escaped line: a receiver's text could forge lines or send escapes.
            error = one_line(row["last_error"].strip())
            self.stdout.write(
                f"{row['table']} #{row['id']} message {row['message_id']} shard {row['shard']} "
                f"{row['category']} "
                f"object {row['object_identifier']}: {row['attempts']} attempt(s), dead since "
                f"{row['dead_at']}: {error}"
            )
        self.stdout.write(f"{len(found)} dead letter(s).")

    def _list_groups(
        self, selections: list[OutboxQuerySet[Any]], keys: set[str], as_json: bool
    ) -> None:
        """Each table's dead letters by cause, the largest first (only these causes when
        `keys`)."""
        tables = [(rows.model._meta.label, group_dead_letters(rows)) for rows in selections]
        if as_json:
            found = [_group_json(table, group) for table, grouping in tables
                     for group in _kept(grouping, keys)]  # fmt: skip
            found += [_other_json(table, grouping) for table, grouping in tables
                      if grouping.other and not keys]  # fmt: skip
            self.stdout.write(json.dumps(found, indent=2))
            return
        for table, grouping in tables:
            groups = _kept(grouping, keys)
            if not groups and not grouping.other:
                continue
            self.stdout.write(
                f"{table}: {grouping.letters} dead letter(s), {len(grouping.groups)} cause(s)"
            )
            for group in groups:
                self._write_group(group)
            if grouping.other and not keys:
                self.stdout.write(f"  {grouping.other} dead letter(s) of further causes")
        self.stdout.write(f"{sum(len(_kept(grouping, keys)) for _, grouping in tables)} cause(s).")

    def _write_group(self, group: DeadLetterGroup) -> None:
        indent = " " * (KEY_LENGTH + 4)
        self.stdout.write(f"  {group.key}  {group.count} dead letter(s): {group.cause}")
        self.stdout.write(
            f"{indent}categories {', '.join(group.category_names)}; dead from "
            f"{_iso(group.first_dead_at)} to {_iso(group.last_dead_at)}"
        )
        example = one_line(group.sample_error.strip())
        self.stdout.write(f"{indent}e.g. #{group.sample_ids[0]}: {example}")


def _change(rows: OutboxQuerySet[Any], discard: bool, auditor: Any, reach: str) -> int:
    """Retry or discard the dead letters of `rows`; with an `auditor`, chunk by chunk
    (`audited_chunks`) with one admin log entry per dead letter, all in one transaction
    (as the admin's actions do). Returns how many."""
    if auditor is None:
        return rows.discard() if discard else rows.retry_dead()
    audit = Audit(auditor, reach)
    using = rows.select_for_update().db  # where retry_dead() / discard() would write
    table = cast("OutboxQuerySet[Any]", rows.model._default_manager.using(using))
    done = 0
    with audit.atomic(using):
        for chunk in audited_chunks(rows):
            audit.record(chunk, discarded=discard)
            mine = table.filter(pk__in=[row.pk for row in chunk])
            done += mine.discard() if discard else mine.retry_dead()
    return done


def _narrowed(options: dict[str, Any]) -> bool:
    selections = ("id", "message_id", "shard", "category", "cause")
    return any(options[selection] for selection in selections)


def _check_numbers(options: dict[str, Any]) -> None:
    """Refuse a row id below 1 (none is), and an id or shard_identifier past 64 bits,
    which a database would answer with an overflow error, not an empty selection."""
    for row_id in options["id"]:
        whole_number("--id", row_id, 1, BIGINT_MAX)
    shard_identifiers("--shard", options["shard"])


def _cause_key(text: str) -> str:
    """An argparse type: a cause key as list --group shows it."""
    key = text.strip().lower()
    if not is_cause_key(key):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cause key ({KEY_LENGTH} hex digits, as list --group shows)"
        )
    return key


def _kept(grouping: Grouping, keys: set[str]) -> list[DeadLetterGroup]:
    return [group for group in grouping.groups if not keys or group.key in keys]


def _group_json(table: str, group: DeadLetterGroup) -> dict[str, Any]:
    return {
        "table": table,
        "cause": group.key,
        "count": group.count,
        "failures": [
            {"receiver": f.receiver, "exception": f.exception, "message": f.message}
            for f in group.cause.failures
        ],
        "categories": group.category_names,
        "first_dead_at": _iso(group.first_dead_at),
        "last_dead_at": _iso(group.last_dead_at),
        "sample_error": group.sample_error,
        "sample_ids": group.sample_ids,
    }


def _other_json(table: str, grouping: Grouping) -> dict[str, Any]:
    """The dead letters of causes past the grouping's bound, as one entry with no key."""
    return {"table": table, "cause": None, "count": grouping.other, "failures": []}


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
