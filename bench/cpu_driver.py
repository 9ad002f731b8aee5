"""One side of the CPU-per-message section (`bench.cpu_per_message`): a script that each
side's own interpreter runs, `python bench/cpu_driver.py DATABASE`, with PYTHONPATH set
to the side's tree so that it imports that tree's `outbox`, the head's or the baseline's.

It imports nothing from `bench`: the baseline's tree has a `bench` of its own, and the
head's tree on sys.path would shadow the baseline's `outbox`. It uses only what both
sides offer: `outbox_context`, `RegionOutbox`, `ShardLease`, the process signal and
`drain_outboxes()`, with its `concurrency` keyword where the side has one.

It reads commands from stdin, a JSON object a line, and answers each with a JSON line on
stdout; at start, unasked, it says where its `outbox` comes from and what it runs on.

- ``{"op": "write", "shape": NAME, "shards": N, "objects_per_shard": M}``: write the
  shape's rows and keep them aside in a table of their own, from which every drain of
  the shape starts;
- ``{"op": "drain", "shape": NAME, "receiver": "count" | "kwargs", "concurrency": N |
  null}``: put the shape's rows back in the outbox (untimed), connect the receiver, and
  measure the process's CPU time (every thread's, user and system) across
  `drain_outboxes()`, called again while rows are left. null is the side's default
  concurrency; a side without the setting drains as it always does and answers
  ``"concurrency": null``.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import platform
import sys
import time
from typing import Any

# `outbox` reads Django's settings lazily, so its categories can be declared before
# `configure()` starts Django.
from outbox import OutboxCategory, OutboxScope


class CpuCategory(OutboxCategory):
    MESSAGE = 950  # one category and one scope serve both shapes: only their sizes differ


class CpuScope(OutboxScope):
    CPU = 950, {CpuCategory.MESSAGE}


# The columns set per row g of a shape (g in id order: shard g % shards, its objects in
# turn), as `bench.shapes.Shape.messages()` makes them; `message_id` only where the side
# has one. Every other column comes from a row the side wrote through its own write path.
PER_ROW = {
    "id": "g + 1",
    "shard_identifier": "mod(g, %(shards)s) + 1",
    "object_identifier": "mod(g, %(shards)s) * %(objects)s + g / %(shards)s + 1",
    "payload": "jsonb_build_object('object', {object}, 'version', 0, 'name', 'o' || {object})",
    "message_id": "gen_random_uuid()",
}

delivered = 0  # calls of the counting receiver
kept: list[dict[str, Any]] = []  # what the keyword-copying receiver was given


def count_call(sender: Any, **kwargs: Any) -> None:
    """The receiver that only counts its calls."""
    global delivered
    delivered += 1


def keep_kwargs(sender: Any, **kwargs: Any) -> None:
    """The receiver that reads its message: a copy of its keyword arguments."""
    kept.append(dict(kwargs))


RECEIVERS = {"count": count_call, "kwargs": keep_kwargs}


def configure(database: str) -> None:
    """Django with the `outbox` app alone, on `database` (the section created it)."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    settings.configure(
        DEBUG=False,  # DEBUG would keep every query in memory
        USE_TZ=True,
        SECRET_KEY="outbox-bench-cpu",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["outbox"],
        DATABASES={"default": _database(database)},
        OUTBOX_BATCH_ROWS=int(os.environ.get("OUTBOX_BENCH_BATCH_ROWS", "2000")),
        OUTBOX_BATCH_SHARDS=int(os.environ.get("OUTBOX_BENCH_BATCH_SHARDS", "100")),
    )
    django.setup()
    call_command("migrate", verbosity=0, interactive=False, skip_checks=True)


def _database(name: str) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
    }


def _takes_concurrency() -> bool:
    from outbox.engine import drain_outboxes

    return "concurrency" in inspect.signature(drain_outboxes).parameters


def hello() -> dict[str, Any]:
    """Where this side's `outbox` comes from and what it runs on."""
    import django
    import psycopg

    import outbox
    from outbox.conf import outbox_settings

    return {
        "outbox_file": outbox.__file__,
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__})",
        "default_concurrency": outbox_settings.CONCURRENCY if _takes_concurrency() else None,
    }


def write(shape: str, shards: int, objects_per_shard: int) -> dict[str, Any]:
    """Write one row through the side's write path, then the shape's rows from it into
    the shape's own table (one statement), and empty the outbox again."""
    from django.db import connection, transaction

    from outbox import outbox_context
    from outbox.models import RegionOutbox

    with outbox_context(transaction.atomic(), flush=False):
        written = RegionOutbox.objects.create(
            shard_scope=int(CpuScope.CPU),
            shard_identifier=1,
            category=int(CpuCategory.MESSAGE),
            object_identifier=1,
            payload={},
        )
    outbox, kept_rows = _tables(shape)
    quote = connection.ops.quote_name
    select = [
        f"{PER_ROW.get(column, quote(column))} AS {quote(column)}".format(
            object=PER_ROW["object_identifier"]
        )
        for column in _columns()
    ]
    rows = shards * objects_per_shard
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {kept_rows}")
        cursor.execute(
            f"CREATE TABLE {kept_rows} AS SELECT {', '.join(select)} "
            f"FROM {outbox}, generate_series(0::bigint, %(last)s::bigint) AS g "
            f"WHERE id = %(id)s ORDER BY g",
            {"shards": shards, "objects": objects_per_shard, "last": rows - 1, "id": written.pk},
        )
        cursor.execute(f"TRUNCATE {outbox}")
    return {"rows": rows}


def drain(shape: str, receiver: str, concurrency: int | None) -> dict[str, Any]:
    """One measured drain of the shape's rows (see the module docstring)."""
    from outbox.engine import drain_outboxes
    from outbox.models import RegionOutbox
    from outbox.signals import process_region_outbox

    if not _takes_concurrency():
        concurrency = None
    options = {} if concurrency is None else {"concurrency": concurrency}
    _restore(shape)
    callback = RECEIVERS[receiver]
    process_region_outbox.connect(callback, sender=CpuCategory.MESSAGE, weak=False)
    gc.collect()  # every drain starts from the same heap: the last one's garbage is gone
    try:
        cpu, wall, drains = 0.0, 0.0, 0
        while drains == 0 or RegionOutbox.objects.exists():
            cpu_started, wall_started = time.process_time(), time.perf_counter()
            drain_outboxes(**options)
            cpu += time.process_time() - cpu_started
            wall += time.perf_counter() - wall_started
            drains += 1
    finally:
        process_region_outbox.disconnect(callback, sender=CpuCategory.MESSAGE)
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "messages": _take_delivered(),
        "drains": drains,
        "concurrency": concurrency,
    }


def _take_delivered() -> int:
    """How many calls the receivers got since the last drain, resetting them."""
    global delivered
    messages = delivered + len(kept)
    delivered = 0
    kept.clear()
    return messages


def _restore(shape: str) -> None:
    """Empty the outbox and its leases, put the shape's rows back, refresh statistics."""
    from django.db import connection

    from outbox.models import ShardLease

    outbox, kept_rows = _tables(shape)
    quote = connection.ops.quote_name
    leases = quote(ShardLease._meta.db_table)
    columns = ", ".join(map(quote, _columns()))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {outbox}, {leases}")
        cursor.execute(f"INSERT INTO {outbox} ({columns}) SELECT * FROM {kept_rows} ORDER BY id")
        cursor.execute(f"ANALYZE {outbox}")


def _columns() -> list[str]:
    """The outbox table's columns, in the order of its model."""
    from outbox.models import RegionOutbox

    return [field.column for field in RegionOutbox._meta.concrete_fields]


def _tables(shape: str) -> tuple[str, str]:
    """The outbox table and the table its rows for `shape` are kept in, quoted."""
    from django.db import connection

    from outbox.models import RegionOutbox

    quote = connection.ops.quote_name
    return quote(RegionOutbox._meta.db_table), quote(f"cpu_rows_{shape}")


COMMANDS = {"write": write, "drain": drain}


def main() -> None:
    configure(sys.argv[1])
    _reply(hello())
    for line in sys.stdin:
        command = json.loads(line)
        _reply(COMMANDS[command.pop("op")](**command))


def _reply(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
