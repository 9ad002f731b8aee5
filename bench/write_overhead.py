"""(e) Write overhead: what adding the outbox row costs the transaction that saves a model.

Variants, each one committed `transaction.atomic()` per iteration, on the same rows:

- `save`: `item.save()` alone (an UPDATE of an existing row);
- `save_outbox`: the same save plus one RegionOutbox row, inside
  `outbox_context(transaction.atomic(), flush=False)` (the README's pattern; the row is
  left for the drain, so only the write is measured), on the default write path: the
  row is INSERTed by Django's own `save()`;
- `save_outbox_deferred`: the same with `defer=True`: the row is held and written by
  one bulk insert as the block commits, with the COMMIT in the same round trip on
  PostgreSQL;
- `save_orm`: the default path's ORM floor: the same save plus the same row through
  Django's own `Model.save` (no validation, no context, no write path);
- `save_sql` and `save_sql_commit`: the SQL floors of each path: the same save plus the
  same INSERT written by hand (one literal statement through Django's cursor, no model,
  no validation), in its own round trip (`save_sql`, the default path's floor) or sent
  with the COMMIT in one round trip (`save_sql_commit`, the deferred path's floor);
  `save_sql_commit_row` is that floor plus building the outbox row's model instance
  (not saved), the input every path of the API takes and the floor leaves out;
- `save_procrastinate` (when installed): the same save plus deferring one procrastinate
  job through its Django integration, inside the same transaction.

The variants alternate in blocks (rotating which goes first each round) so that noise
on this shared machine hits all of them alike; a warm-up block of each runs first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

POOL = 100


def _variants(items: list[Any], with_procrastinate: bool) -> dict[str, Callable[[int], None]]:
    from django.db import connection, models, transaction

    from bench.outboxes import BenchCategory, BenchScope
    from outbox import outbox_context
    from outbox.backends.select import commit_with_last_insert
    from outbox.models import RegionOutbox

    def touch(i: int) -> Any:
        item = items[i % len(items)]
        item.version += 1
        return item

    def outbox_row(item: Any) -> RegionOutbox:
        """The one outbox row every variant writes for a save of `item`."""
        return RegionOutbox(
            shard_scope=BenchScope.OBJECT,
            shard_identifier=item.pk,
            category=BenchCategory.ITEM_UPDATE,
            object_identifier=item.pk,
            payload={"name": item.name, "version": item.version},
        )

    def save(i: int) -> None:
        item = touch(i)
        with transaction.atomic():
            item.save()

    def save_outbox(i: int) -> None:
        item = touch(i)
        with outbox_context(transaction.atomic(), flush=False):
            item.save()
            outbox_row(item).save()

    def save_orm(i: int) -> None:
        """The ORM floor: the same row through Django's own `Model.save` (no validation,
        no context, no write path)."""
        item = touch(i)
        with transaction.atomic():
            item.save()
            models.Model.save(outbox_row(item))

    def save_outbox_deferred(i: int) -> None:
        item = touch(i)
        with outbox_context(transaction.atomic(), flush=False, defer=True):
            item.save()
            outbox_row(item).save()

    # The statement the outbox sends for this row (the columns it does not leave to
    # database defaults), with the COMMIT where the outbox sends it along too.
    insert_sql = (
        'INSERT INTO "outbox_regionoutbox" ("shard_scope", "shard_identifier", "category", '
        '"object_identifier", "payload", "attempts", "first_attempt_at", "last_attempt_at", '
        '"last_error") VALUES (%s, %s, %s, %s, %s, 0, NULL, NULL, \'\') RETURNING "id"'
    )
    rides_along = commit_with_last_insert(connection.alias) is not None

    def sql_floor(with_commit: bool, build_row: bool = False) -> Callable[[int], None]:
        sql = insert_sql + "; COMMIT" if with_commit and rides_along else insert_sql

        def save_sql(i: int) -> None:
            item = touch(i)
            with transaction.atomic():
                item.save()
                if build_row:  # what the API takes: a model instance, not SQL
                    outbox_row(item)
                payload = json.dumps({"name": item.name, "version": item.version})
                with connection.cursor() as cursor:
                    cursor.execute(
                        sql,
                        [
                            BenchScope.OBJECT.value,
                            item.pk,
                            BenchCategory.ITEM_UPDATE.value,
                            item.pk,
                            payload,
                        ],
                    )
                    cursor.fetchall()

        return save_sql

    variants: dict[str, Callable[[int], None]] = {
        "save": save,
        "save_outbox": save_outbox,
        "save_outbox_deferred": save_outbox_deferred,
        "save_orm": save_orm,
        # The floors: the same INSERT written by hand, in its own round trip (the
        # default path's floor) and riding with the COMMIT (the deferred path's floor).
        "save_sql": sql_floor(with_commit=False),
        "save_sql_commit": sql_floor(with_commit=True),
        # The deferred path's floor plus building the row instance the API takes.
        "save_sql_commit_row": sql_floor(with_commit=True, build_row=True),
    }
    if with_procrastinate:
        from bench.tasks import deliver

        def save_procrastinate(i: int) -> None:
            item = touch(i)
            with transaction.atomic():
                item.save()
                deliver.configure(lock=f"{int(BenchScope.OBJECT)}:{item.pk}").defer(
                    shard_scope=int(BenchScope.OBJECT),
                    shard_identifier=item.pk,
                    object_identifier=item.pk,
                    payload={"name": item.name, "version": item.version},
                )

        variants["save_procrastinate"] = save_procrastinate
    return variants


def measure(iterations: int, block: int, with_procrastinate: bool) -> dict[str, Any]:
    """Time `iterations` of each variant, alternating blocks of `block` iterations."""
    from bench.db import reset
    from bench.models import Item

    reset()
    items = Item._default_manager.bulk_create(Item(name=f"item {n}") for n in range(POOL))
    variants = _variants(items, with_procrastinate)
    names = list(variants)
    for name in names:  # warm-up: connections, statement caches, code paths
        for i in range(block):
            variants[name](i)
    spent = dict.fromkeys(names, 0.0)
    rounds = max(iterations // block, 1)
    counter = 0
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            function = variants[name]
            started = time.perf_counter()
            for _ in range(block):
                function(counter)
                counter += 1
            spent[name] += time.perf_counter() - started
    done = rounds * block
    per_op_us = {name: spent[name] / done * 1e6 for name in names}
    result: dict[str, Any] = {
        "iterations_each": done,
        "block": block,
        "per_op_us": per_op_us,
        "ratio": per_op_us["save_outbox"] / per_op_us["save"],
        "orm_floor_ratio": per_op_us["save_orm"] / per_op_us["save"],
        "sql_floor_ratio": per_op_us["save_sql"] / per_op_us["save"],
        "deferred_ratio": per_op_us["save_outbox_deferred"] / per_op_us["save"],
        "deferred_sql_floor_ratio": per_op_us["save_sql_commit"] / per_op_us["save"],
        "deferred_sql_floor_row_ratio": per_op_us["save_sql_commit_row"] / per_op_us["save"],
    }
    if "save_procrastinate" in per_op_us:
        result["procrastinate_ratio"] = per_op_us["save_procrastinate"] / per_op_us["save"]
    reset()
    return result
