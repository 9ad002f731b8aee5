"""Backfill: write the current state of objects that already exist as outbox messages.

The messages are those the model's own `outboxes_for_update()` returns (see
`outbox.writes.producers.OutboxProducer`), so shards, payloads, message ids and headers
are what a save of the object writes; they go through the outbox tables' `bulk_create`,
the public write path (validated, flushed after commit or left to the drain, held until
the commit where OUTBOX_DEFER_WRITES says so). Objects are read in primary-key order, a
batch per transaction, locked (`select_for_update`) while their messages are written: a
save of one of them running at the same time commits before or after the batch, so its
message and the batch's are delivered in commit order and the newest state wins.

`backfill()` yields each batch once its transaction has committed, so the last batch a
caller saw is written and a run stopped there resumes with ``after=batch.last_pk``.
Messages coalesce with the pending ones of their object, so running a backfill again
sends each object's state again, once per group, to receivers that are idempotent
anyway. `manage.py outbox_backfill` runs it, with progress, throttling and stops.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import connections, models, router, transaction

from outbox.categories import registry
from outbox.exceptions import InvalidOutboxMessage, OutboxError
from outbox.models import OutboxBase
from outbox.writes.context import outbox_context

# Objects read, and whose messages are written, per transaction.
BATCH_SIZE = 500


class BackfillError(OutboxError):
    """A backfill refused before its first batch was written, or stopped by a batch
    it could not write (that batch rolled back, the ones before it committed)."""


@dataclass(frozen=True)
class BackfillBatch:
    """One committed batch (or, in a dry run, one batch read)."""

    objects: int  # objects read
    messages: int  # messages written (in a dry run: that would have been written)
    last_pk: Any  # the primary key of its last object: resume after it
    tables: tuple[type[OutboxBase], ...]  # the outbox tables written to


def is_producer(model: type[models.Model]) -> bool:
    """Whether `model` builds its messages itself (`outboxes_for_update()`)."""
    return callable(getattr(model, "outboxes_for_update", None)) and not issubclass(
        model, OutboxBase
    )


def producer_models() -> list[type[models.Model]]:
    """The installed models a backfill can run on, by label."""
    found = [model for model in apps.get_models() if is_producer(model)]
    return sorted(found, key=lambda model: model._meta.label)


def messages_of(
    objs: Sequence[models.Model], categories: frozenset[int] | None
) -> tuple[list[tuple[Any, OutboxBase]], set[int]]:
    """The messages of `objs` whose category is one of `categories` (all of them for
    None), each with its object's primary key, and the categories of every message the
    objects returned."""
    chosen: list[tuple[Any, OutboxBase]] = []
    seen: set[int] = set()
    for obj in objs:
        for message in obj.outboxes_for_update():  # type: ignore[attr-defined]
            seen.add(int(message.category))
            if categories is None or int(message.category) in categories:
                chosen.append((obj.pk, message))
    return chosen, seen


def backfill(
    queryset: models.QuerySet[Any],
    *,
    categories: frozenset[int] | None = None,
    batch_size: int = BATCH_SIZE,
    after: Any = None,
    using: str | None = None,
    flush: bool = False,
    dry_run: bool = False,
) -> Iterator[BackfillBatch]:
    """Write the messages of every object of `queryset` (of a model with
    `outboxes_for_update()`) whose primary key is above `after`, `batch_size` objects per
    transaction, in primary-key order; yield each batch once committed::

        for batch in backfill(Organization.objects.all(), categories=frozenset({Category.SEARCH})):
            print("done up to", batch.last_pk)

    `categories`: only the messages of these categories (None: every message the
    objects return). The objects are read, and their messages written, on `using`
    (default: the model's write database), in one transaction per batch. `flush=True`
    delivers each batch's shards in this process after its commit, as a save inside
    `outbox_context()` does; by default they are left to the drain. `dry_run` reads and
    validates, writes nothing, and yields what would have been written.

    Raises BackfillError when the first objects that return messages return none of
    `categories` (before anything is written), or when a batch holds a message that
    validation refuses (naming its object; that batch is rolled back).
    """
    model = queryset.model
    if not is_producer(model):
        raise BackfillError(f"{model._meta.label} has no outboxes_for_update().")
    using = using or router.db_for_write(model)
    ordered = queryset.using(using).order_by("pk")
    lock = _lock_options(using)
    checked = categories is None
    last = after
    while True:
        page = ordered if last is None else ordered.filter(pk__gt=last)
        if dry_run:
            objs = list(page[:batch_size])
            messages, seen = messages_of(objs, categories)
            checked = checked or _check_categories(model, categories, messages, seen)
            _validate(model, messages)
        else:
            with outbox_context(transaction.atomic(using=using), flush=flush):
                objs = list(page.select_for_update(**lock)[:batch_size])
                messages, seen = messages_of(objs, categories)
                checked = checked or _check_categories(model, categories, messages, seen)
                _write(model, messages, using)
        if not objs:
            return
        last = objs[-1].pk
        tables = tuple(dict.fromkeys(type(message) for _, message in messages))
        yield BackfillBatch(len(objs), len(messages), last, tables)


def _lock_options(using: str) -> dict[str, Any]:
    # NO KEY UPDATE (PostgreSQL) locks the objects against saves but not against rows
    # that reference them.
    if connections[using].features.has_select_for_no_key_update:
        return {"no_key": True}
    return {}


def _check_categories(
    model: type[models.Model],
    categories: frozenset[int] | None,
    messages: list[tuple[Any, OutboxBase]],
    seen: set[int],
) -> bool:
    """True once the objects' messages include one of `categories`; refuse objects whose
    messages do not (a category the model never writes), before anything is written."""
    if messages or not seen:
        return bool(messages)
    wanted = ", ".join(registry.category_name(value) for value in sorted(categories or ()))
    written = ", ".join(f"{registry.category_name(value)} ({value})" for value in sorted(seen))
    raise BackfillError(
        f"{model._meta.label}.outboxes_for_update() returns no message of {wanted} for "
        f"its first objects: its messages are of {written}. Add the category to "
        f"outboxes_for_update() first, or backfill one of those."
    )


def _write(model: type[models.Model], messages: list[tuple[Any, OutboxBase]], using: str) -> None:
    """One validated bulk insert per outbox table, on `using`, as a producer's save."""
    by_table: dict[type[OutboxBase], list[OutboxBase]] = defaultdict(list)
    for _, message in messages:
        by_table[type(message)].append(message)
    try:
        for table, rows in by_table.items():
            table._default_manager.db_manager(using).bulk_create(rows)
    except InvalidOutboxMessage:
        _validate(model, messages)  # raises again, naming the object
        raise


def _validate(model: type[models.Model], messages: list[tuple[Any, OutboxBase]]) -> None:
    """Validate the messages as a write would; a refused one raises BackfillError
    naming its object."""
    for pk, message in messages:
        try:
            message.validate_message()
        except InvalidOutboxMessage as exc:
            raise BackfillError(f"{model._meta.label} object pk {pk}: {exc}") from exc
