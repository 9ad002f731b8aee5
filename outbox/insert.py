"""The write path's single INSERT, without the ORM's per-call query compilation.

An outbox row is written inside the caller's transaction, next to their own model save;
compiling a fresh INSERT through the ORM every time costs several times what the
statement itself costs the database. Here the statement text is built once per table,
database and set of database-defaulted columns, and only the values are prepared
per row. Anything unusual (an update, a given primary key, multi-table inheritance, a
database that cannot return the new key) goes through Django's own `save()`.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import signals
from django.db.models.expressions import DatabaseDefault

if TYPE_CHECKING:
    from django.db.models import Field

    from outbox.models import OutboxBase


def can_insert_directly(row: OutboxBase, using: str, kwargs: dict[str, Any]) -> bool:
    return (
        row._state.adding
        and row.pk is None
        and not kwargs.get("update_fields")
        and not kwargs.get("force_update")
        and not row._meta.parents
        and connections[using].features.can_return_columns_from_insert
    )


def insert(row: OutboxBase, using: str) -> None:
    """INSERT the row and set its primary key, as `save()` would (signals included)."""
    model = type(row)
    connection = connections[using]
    if signals.pre_save.has_listeners(model):
        signals.pre_save.send(model, instance=row, raw=False, using=using, update_fields=None)
    values = [field.pre_save(row, True) for field in _fields(model)]
    defaulted = tuple(isinstance(value, DatabaseDefault) for value in values)
    sql = _statement(model, using, defaulted)
    params = [
        field.get_db_prep_save(value, connection=connection)
        for field, value, default in zip(_fields(model), values, defaulted, strict=True)
        if not default
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        (row.pk,) = cursor.fetchone()
    for field, default in zip(_fields(model), defaulted, strict=True):
        if default:
            # Unknown until read back, as Django leaves database defaults it did not return.
            row.__dict__.pop(field.attname, None)
    row._state.adding = False
    row._state.db = using
    if signals.post_save.has_listeners(model):
        signals.post_save.send(
            model, instance=row, created=True, update_fields=None, raw=False, using=using
        )


@cache
def _fields(model: type[OutboxBase]) -> tuple[Field[Any, Any], ...]:
    return tuple(field for field in model._meta.concrete_fields if not field.primary_key)


@cache
def _statement(model: type[OutboxBase], using: str, defaulted: tuple[bool, ...]) -> str:
    """INSERT ... RETURNING pk; database-defaulted columns are left out, so they take
    their default (SQLite has no DEFAULT keyword in VALUES)."""
    quote = connections[using].ops.quote_name
    columns = [
        quote(str(field.column))
        for field, default in zip(_fields(model), defaulted, strict=True)
        if not default
    ]
    table = quote(model._meta.db_table)
    pk = quote(str(model._meta.pk.column if model._meta.pk else "id"))
    placeholders = ", ".join(["%s"] * len(columns))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders}) RETURNING {pk}"
