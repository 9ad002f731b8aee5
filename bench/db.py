"""Database plumbing: create the bench database, start Django, reset and bulk-load tables.

Everything here is setup, never measured. Loads are one `INSERT ... SELECT
generate_series` statement, so a 1M-row backlog takes seconds, and every contender
gets the identical rows (same ids order, shards, objects and payloads).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg import sql

DEFAULT_DB = "outbox_bench"
LOADED_COLUMNS = ("shard_scope", "shard_identifier", "category", "object_identifier", "payload")


def conninfo(dbname: str | None = None) -> dict[str, Any]:
    """psycopg connection keywords from the same environment as `bench.settings`."""
    return {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": int(os.environ.get("PGPORT", "5432")),
        "user": os.environ.get("PGUSER", "postgres"),
        "password": os.environ.get("PGPASSWORD", ""),
        "dbname": dbname or os.environ.get("OUTBOX_BENCH_DB", DEFAULT_DB),
    }


def create_database(name: str) -> None:
    """Create the bench database afresh: it is scratch, and a schema left by an older
    version of the app (whose migrations may have been rewritten) must not survive."""
    with psycopg.connect(**conninfo("postgres"), autocommit=True, connect_timeout=10) as conn:
        database = sql.Identifier(name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(database))


def setup_django() -> None:
    """Start Django with the bench settings (in this process; workers call it too)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _tables() -> list[str]:
    from django.conf import settings

    from bench.models import Item
    from outbox.engine import outbox_models
    from outbox.models import ShardLease

    tables = [model._meta.db_table for model in outbox_models()]
    tables += [ShardLease._meta.db_table, Item._meta.db_table]
    if getattr(settings, "HAS_PROCRASTINATE", False):
        tables += ["procrastinate_jobs", "procrastinate_events", "procrastinate_workers"]
    return tables


def reset() -> None:
    """Empty every table a contender touches, so each starts from the same state."""
    from django.db import connection

    with connection.cursor() as cursor:
        names = ", ".join(connection.ops.quote_name(table) for table in _tables())
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def analyze() -> None:
    """Refresh planner statistics after a bulk load, as autovacuum would in production."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in _tables():
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")


def _defaults(model: Any, explicit: set[str]) -> dict[str, Any]:
    """Values for the columns without a database default that the load does not set."""
    from django.db import connection
    from django.db.models import NOT_PROVIDED

    values: dict[str, Any] = {}
    for field in model._meta.concrete_fields:
        if field.primary_key or field.column in explicit:
            continue
        if getattr(field, "db_default", NOT_PROVIDED) is not NOT_PROVIDED:
            continue
        if field.has_default():
            values[field.column] = field.get_db_prep_save(field.get_default(), connection)
        elif not field.null:
            raise RuntimeError(f"bench cannot fill {model.__name__}.{field.name}: add it here")
    return values


def load_shape(shape: Any) -> int:
    """Insert the rows of `shape` into RegionOutbox in one statement; return the count.

    Must match `Shape.messages()`: row g goes to shard g % shards, object
    shard * objects + (g / shards) % objects + 1, version (g / shards) / objects.
    """
    from django.db import connection

    from outbox.models import RegionOutbox

    extra = _defaults(RegionOutbox, set(LOADED_COLUMNS))
    columns = [*LOADED_COLUMNS, *extra]
    select = [
        "%(scope)s",
        "s.shard + 1",
        "%(category)s",
        "s.obj",
        "jsonb_build_object('object', s.obj, 'version', s.pos / %(objects)s, 'name', 'o' || s.obj)",
        *[f"%({name})s" for name in extra],
    ]
    quote = connection.ops.quote_name
    statement = (
        f"INSERT INTO {quote(RegionOutbox._meta.db_table)} ({', '.join(map(quote, columns))}) "
        f"SELECT {', '.join(select)} FROM ("
        "  SELECT g, mod(g, %(shards)s) AS shard, g / %(shards)s AS pos,"
        "         mod(g, %(shards)s) * %(objects)s + mod(g / %(shards)s, %(objects)s) + 1 AS obj"
        "  FROM generate_series(0::bigint, %(last)s::bigint) AS g"
        ") AS s ORDER BY s.g"
    )
    params = {
        "scope": int(shape.scope),
        "category": int(shape.category),
        "shards": shape.shards,
        "objects": shape.objects_per_shard,
        "last": shape.rows - 1,
        **extra,
    }
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        inserted = cursor.rowcount
    analyze()
    return int(inserted)


def outbox_rows() -> int:
    """Rows left in RegionOutbox (a drain is done when this is 0)."""
    from outbox.models import RegionOutbox

    return int(RegionOutbox.objects.count())
