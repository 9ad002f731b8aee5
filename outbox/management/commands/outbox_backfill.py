"""`manage.py outbox_backfill APP_LABEL.MODEL --category NAME`: write the current state of
every existing object of a model as messages, the ones its `outboxes_for_update()` returns
(what a save writes), for a category added to a model with data, or an outbox adopted by
one (`--all-categories`). It runs `outbox.management.backfill.backfill`: a batch of
`--batch-size` objects per transaction, in primary-key order, locked while their messages
are written; the messages are left to the drain (`--flush` delivers each batch from this
process instead).

Progress goes to stderr at each batch: one line per batch, or a bar redrawn in place on a
terminal; `-v 0` prints nothing but errors. The summary, with the last primary key done,
goes to stdout. A run stopped (SIGINT/SIGTERM: after the batch in hand, exit status 0),
failed or killed resumes with `--after` that key; running it again from the start is
harmless too: each object's messages coalesce with those pending for it, and receivers
are idempotent. `--max-pending N` waits before each batch while the tables written to hold
more than N pending messages, so a drain keeps up. `--dry-run` reads and validates the
messages, and writes nothing.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import models, router

from outbox.categories import registry
from outbox.management.arguments import category_value, database_alias, whole_number
from outbox.management.backfill import (
    BATCH_SIZE,
    BackfillBatch,
    BackfillError,
    backfill,
    is_producer,
    producer_models,
)
from outbox.models import OutboxBase

# How often a backfill waiting on --max-pending looks at the backlog again.
PENDING_POLL_SECONDS = 0.5
# A wait this long with nothing drained: say so, in case no drain runs.
STALLED_SECONDS = 30.0
BAR_WIDTH = 24


class Command(BaseCommand):
    help = "Write the current state of a model's existing objects as outbox messages."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "model", metavar="APP_LABEL.MODEL",
            help="The model whose objects to backfill: one with outboxes_for_update() "
            "(an OutboxProducer).",
        )  # fmt: skip
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--category", action="append", default=[], metavar="NAME",
            help="Write the messages of this category, by name or value (repeatable).",
        )  # fmt: skip
        which.add_argument(
            "--all-categories", action="store_true",
            help="Write every message outboxes_for_update() returns.",
        )  # fmt: skip
        parser.add_argument(
            "--batch-size", type=int, default=BATCH_SIZE, metavar="N",
            help=f"Objects per transaction, 1 or more (default {BATCH_SIZE}).",
        )  # fmt: skip
        parser.add_argument(
            "--after", metavar="PK",
            help="Start after this primary key: the last one an interrupted run printed.",
        )  # fmt: skip
        parser.add_argument(
            "--database", default=None,
            help="Database alias to read the objects from and write their messages to "
            "(default: the model's write database).",
        )  # fmt: skip
        parser.add_argument(
            "--dry-run", action="store_true",
            help="Count and validate the messages it would write; write nothing.",
        )  # fmt: skip
        parser.add_argument(
            "--flush", action="store_true",
            help="Deliver each batch from this process right after its commit, as a save "
            "inside outbox_context() does; default: leave the messages to the drain.",
        )  # fmt: skip
        parser.add_argument(
            "--max-pending", type=int, default=0, metavar="N",
            help="Before each batch, wait while the outbox tables written to hold more "
            "than N pending messages, so the drain keeps up (default 0: never wait).",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        whole_number("--batch-size", options["batch_size"], 1)
        whole_number("--max-pending", options["max_pending"], 0)
        model = _producer(options["model"])
        alias = database_alias(options["database"]) or router.db_for_write(model)
        categories = (
            None
            if options["all_categories"]
            else frozenset(category_value(name) for name in options["category"])
        )
        if categories is not None and not categories:
            raise CommandError("Say which messages: --category NAME, or --all-categories.")
        after = _primary_key(model, options["after"])
        self.verbosity = options["verbosity"]
        self.label = model._meta.label
        self.dry_run = options["dry_run"]
        self.using = alias
        queryset = model._default_manager.all()
        pending = queryset.using(alias)
        total = (pending.filter(pk__gt=after) if after is not None else pending).count()
        what = (
            "every message"
            if categories is None
            else ", ".join(registry.category_name(value) for value in sorted(categories))
        )
        batches = backfill(
            queryset,
            categories=categories,
            batch_size=options["batch_size"],
            after=after,
            using=alias,
            flush=options["flush"],
            dry_run=self.dry_run,
        )
        progress = _Progress(self, total)
        objects = messages = 0
        last = after
        stop = _StopRequests()
        with stop.installed():
            try:
                for batch in self._throttled(batches, options["max_pending"], stop):
                    objects += batch.objects
                    messages += batch.messages
                    last = batch.last_pk
                    progress.batch_done(objects, messages, last)
                    if stop.signum is not None:
                        break
            except BackfillError as exc:
                progress.end()
                raise CommandError(f"{exc}{_resume(last, objects)}") from exc
            except KeyboardInterrupt:  # a second SIGINT/SIGTERM
                progress.end()
                raise CommandError(
                    f"Stopped at once by a second signal: the batch in hand was rolled "
                    f"back.{_resume(last, objects)}"
                ) from None
        progress.end()
        elapsed = progress.elapsed()
        if self.verbosity < 1:
            return
        rate = f"{objects / elapsed:,.0f} objects/s" if elapsed > 0 else "no time"
        done = f"{objects:,} object(s) of {self.label} as {messages:,} message(s) ({what})"
        if self.dry_run:
            self.stdout.write(
                f"Dry run: would write {done} on {alias}, in {elapsed:.1f}s "
                f"({rate}). Nothing was written."
            )
            return
        self.stdout.write(f"Backfilled {done} on {alias} in {elapsed:.1f}s ({rate}).")
        if stop.signum is not None:
            self.stdout.write(
                f"Stopped by signal {stop.signum}: {objects:,} of {total:,} object(s) "
                f"done.{_resume(last, objects)}"
            )
        elif last is not None:
            self.stdout.write(f"Last pk done: {last}.")

    def _throttled(
        self, batches: Iterator[BackfillBatch], max_pending: int, stop: _StopRequests
    ) -> Iterator[BackfillBatch]:
        """The batches, each asked for (so read and written) only when the tables the
        backfill writes to hold no more than `max_pending` pending messages (0: at once),
        and none once a stop was asked for."""
        tables: dict[type[OutboxBase], None] = {}
        while stop.signum is None:
            if max_pending and tables and not self.dry_run:
                self._wait_for_drain(list(tables), max_pending, stop)
                if stop.signum is not None:
                    return
            batch = next(batches, None)
            if batch is None:
                return
            tables.update(dict.fromkeys(batch.tables))
            yield batch

    def _wait_for_drain(
        self, tables: list[type[OutboxBase]], most: int, stop: _StopRequests
    ) -> None:
        started = last_seen = time.monotonic()
        least = None
        warned = False
        while stop.signum is None:
            count = sum(_pending_up_to(table, self.using, most + 1) for table in tables)
            if count <= most:
                return
            now = time.monotonic()
            if least is None or count < least:
                least, last_seen = count, now
            if not warned and now - last_seen >= STALLED_SECONDS and self.verbosity >= 1:
                warned = True
                self.stderr.write(
                    f"outbox_backfill: waiting {now - started:.0f}s for the drain: more "
                    f"than {most:,} messages still pending and none drained meanwhile. Is a "
                    "drain running (manage.py drain_outboxes --loop)? --max-pending 0 "
                    "writes without waiting."
                )
            time.sleep(PENDING_POLL_SECONDS)


def _producer(label: str) -> type[models.Model]:
    """The model named `label`, if its objects can be backfilled; else a command error
    listing those that can."""
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError):
        model = None
    if model is not None and is_producer(model):
        return model
    choices = ", ".join(m._meta.label for m in producer_models()) or "none is installed"
    problem = (
        f"Unknown model {label!r}"
        if model is None
        else f"{model._meta.label} has no outboxes_for_update() (it is not an OutboxProducer)"
    )
    raise CommandError(f"{problem}; the models that write their own messages are {choices}.")


def _primary_key(model: type[models.Model], value: str | None) -> Any:
    if value is None:
        return None
    try:
        return model._meta.pk.to_python(value)
    except ValidationError as exc:
        raise CommandError(
            f"--after {value!r} is not a primary key of {model._meta.label}: "
            f"{' '.join(exc.messages)}"
        ) from None


def _resume(last: Any, objects: int) -> str:
    if last is None or not objects:
        return " Nothing was written."
    return f" Resume with --after {last} (the last primary key done)."


def _pending_up_to(table: type[OutboxBase], using: str, limit: int) -> int:
    """The table's pending rows, counted up to `limit`: a big backlog costs no more
    than `limit` rows read."""
    return int(table.objects.using(using).pending()[:limit].count())


class _Progress:
    """The progress line at each batch, on stderr: one line per batch, or a bar redrawn
    in place when stderr is a terminal. Nothing at verbosity 0."""

    def __init__(self, command: Command, total: int) -> None:
        self.command = command
        self.total = total
        self.started = time.monotonic()
        self.shown = command.verbosity >= 1
        self.in_place = self.shown and command.stderr.isatty()
        self.drawn = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def batch_done(self, objects: int, messages: int, last: Any) -> None:
        if not self.shown:
            return
        elapsed = self.elapsed()
        rate = objects / elapsed if elapsed > 0 else 0.0
        # Objects saved during the run may take it past the count made at its start.
        share = min(objects / self.total, 1.0) if self.total else 1.0
        verb = "would write" if self.command.dry_run else "written"
        figures = (
            f"{objects:,}/{self.total:,} objects {share:4.0%}, {messages:,} messages "
            f"{verb}, {rate:,.0f} objects/s, last pk {last}"
        )
        if self.in_place:
            filled = round(share * BAR_WIDTH)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            self.command.stderr.write(f"\r[{bar}] {figures}", ending="")
            self.drawn = True
        else:
            self.command.stderr.write(f"outbox_backfill {self.command.label}: {figures}")

    def end(self) -> None:
        if self.drawn:
            self.command.stderr.write("")  # ends the bar's line
            self.drawn = False


class _StopRequests:
    """SIGINT and SIGTERM ask the backfill to stop after the batch in hand; a second one
    stops it at once (the batch in hand rolls back). Installed only on the main thread,
    where Python delivers signals."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
