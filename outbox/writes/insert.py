"""The deferred writer's last INSERT, the one that carries the COMMIT: rendered here.

`bulk_create` builds and compiles a query for every call, which costs a one-row
transaction more than the INSERT itself does in the database. The statement's text
for a table is always the same apart from which columns take their database default,
so it is put together from a cached plan: the columns, their `get_db_prep_save`
values (what `bulk_create` sends), `DEFAULT` where a field's value is its database
default, and `RETURNING` the primary key and the database defaults, converted as a
queryset would convert them. Used only where the COMMIT can ride along (PostgreSQL,
whose multi-row `INSERT ... RETURNING` returns rows in the order given).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import NOT_PROVIDED, Field
from django.db.models.expressions import DatabaseDefault

from outbox.columns import Convert, column_converter

if TYPE_CHECKING:
    from outbox.models import OutboxBase


@dataclass(frozen=True)
class _Plan:
    fields: tuple[Field[Any, Any], ...]
    head: str  # INSERT INTO "table" ("a", "b", ...) VALUES
    tail: str  # RETURNING "id", the columns with a database default
    returned: tuple[tuple[str, Convert], ...]  # (attname, converter) per returned column
    # Left to bulk_create: a field renders its own placeholder, or the key is not one
    # the database assigns.
    compiled_elsewhere: bool


@cache
def _plan(model: type[OutboxBase], using: str) -> _Plan:
    connection = connections[using]
    quote = connection.ops.quote_name
    meta = model._meta
    fields = tuple(f for f in meta.concrete_fields if not f.primary_key)
    returned = (meta.pk, *(f for f in fields if f.db_default is not NOT_PROVIDED))
    columns = ", ".join(quote(str(f.column)) for f in fields)
    return _Plan(
        fields=fields,
        head=f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ",
        tail=" RETURNING " + ", ".join(quote(str(f.column)) for f in returned),
        returned=tuple((f.attname, column_converter(model, f.name, connection)) for f in returned),
        compiled_elsewhere=any(hasattr(f, "get_placeholder") for f in fields)
        or not getattr(meta.pk, "db_returning", False),
    )


def insert(model: type[OutboxBase], rows: list[OutboxBase], using: str) -> bool:
    """INSERT `rows` (new, without a primary key) in one statement and set on each its
    primary key and database defaults, as `bulk_create` does on PostgreSQL (the caller
    marks them saved, `internals.mark_written`). False, with nothing sent, when a value
    is an expression (`Now()`, `F(...)`), a field has its own placeholder or the table's
    key is not one the database assigns: those are `bulk_create`'s to compile."""
    plan = _plan(model, using)
    if plan.compiled_elsewhere:
        return False
    connection = connections[using]
    values: list[str] = []
    params: list[Any] = []
    for row in rows:
        marks = []
        for field in plan.fields:
            value = field.pre_save(row, True)
            if isinstance(value, DatabaseDefault):
                marks.append("DEFAULT")
            elif hasattr(value, "resolve_expression"):
                return False
            else:
                marks.append("%s")
                params.append(field.get_db_prep_save(value, connection))
        values.append(f"({', '.join(marks)})")
    with connection.cursor() as cursor:
        cursor.execute(plan.head + ", ".join(values) + plan.tail, params)
        returned = cursor.fetchall()
    for row, columns in zip(rows, returned, strict=True):
        for (attname, convert), value in zip(plan.returned, columns, strict=True):
            setattr(row, attname, convert(value))
    return True
