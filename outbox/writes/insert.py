"""The deferred writer's last INSERT, the one that carries the COMMIT: rendered here.

`bulk_create` builds model instances and compiles a query for every call, which costs a
one-row transaction more than the INSERT itself does in the database. The statement's
text for a table is always the same apart from which columns take their database
default, so it is put together from a cached plan and the held rows' snapshots (field
values by attname, the payload as the JSON text validation checked): the columns, their
`get_db_prep_save` values (what `bulk_create` sends), the payload's JSON text as it is,
`DEFAULT` where a value is its database default, and `RETURNING` the primary key,
converted as a queryset would convert it. The database defaults are not returned:
parsing three timestamps cost more than the rest of the statement's Python, and a row's
`date_added` or `scheduled_for` is read back on first access instead
(`internals.mark_written`). Used only where the COMMIT can ride along (PostgreSQL with
client-side binding, whose multi-row `INSERT ... RETURNING` returns rows in the order
given).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import DateField, DateTimeField, Field, JSONField
from django.db.models.expressions import DatabaseDefault

from outbox.columns import Convert, column_converter

if TYPE_CHECKING:
    from outbox.models import OutboxBase

Snapshot = dict[str, Any]  # a held row's field values by attname; the payload as JSON text


@dataclass(frozen=True)
class _Plan:
    # (attname, how its value becomes a parameter), per column
    columns: tuple[tuple[str, Callable[[Any], Any]], ...]
    head: str  # INSERT INTO "table" ("a", "b", ...) VALUES
    tail: str  # RETURNING "id"
    key: tuple[str, Convert]  # the primary key's attname and converter
    # Left to bulk_create: a field computes or renders its own value at save time
    # (pre_save, get_placeholder), or the key is not one the database assigns.
    compiled_elsewhere: bool


@cache
def _plan(model: type[OutboxBase], using: str) -> _Plan:
    connection = connections[using]
    quote = connection.ops.quote_name
    meta = model._meta
    fields = tuple(f for f in meta.concrete_fields if not f.primary_key)
    columns = ", ".join(quote(str(f.column)) for f in fields)
    return _Plan(
        columns=tuple((f.attname, _parameter(f, connection)) for f in fields),
        head=f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ",
        tail=f" RETURNING {quote(str(meta.pk.column))}",
        key=(meta.pk.attname, column_converter(model, meta.pk.name, connection)),
        compiled_elsewhere=any(not _plain(f) for f in fields)
        or not getattr(meta.pk, "db_returning", False),
    )


def _parameter(field: Field[Any, Any], connection: Any) -> Callable[[Any], Any]:
    if field.attname == "payload" and type(field) is JSONField:
        return _json_text
    return partial(_prep, field, connection)


def _prep(field: Field[Any, Any], connection: Any, value: Any) -> Any:
    return field.get_db_prep_save(value, connection)


def _json_text(text: str) -> str | None:
    # The text as validation encoded it; a payload of None is SQL NULL, as Django
    # stores it.
    return None if text == "null" else text


def _plain(field: Field[Any, Any]) -> bool:
    """Whether saving the field sends its value as it is (no pre_save of its own, no
    placeholder of its own)."""
    if hasattr(field, "get_placeholder"):
        return False
    pre_save = type(field).pre_save
    if pre_save in (DateField.pre_save, DateTimeField.pre_save):
        return not (field.auto_now or field.auto_now_add)  # type: ignore[attr-defined]
    return pre_save is Field.pre_save


def insert(model: type[OutboxBase], snapshots: list[Snapshot], using: str) -> list[Snapshot] | None:
    """INSERT the held rows of `snapshots` (new rows of `model`) in one statement; return,
    per row, its primary key by attname, converted as a queryset converts it. None, with
    nothing sent, when a value is an expression (`Now()`, `F(...)`) or a field computes
    or renders its own value: those are `bulk_create`'s."""
    plan = _plan(model, using)
    if plan.compiled_elsewhere:
        return None
    values: list[str] = []
    params: list[Any] = []
    for snapshot in snapshots:
        marks = []
        for attname, parameter in plan.columns:
            value = snapshot[attname]
            if isinstance(value, DatabaseDefault):
                marks.append("DEFAULT")
            elif hasattr(value, "resolve_expression"):
                return None
            else:
                marks.append("%s")
                params.append(parameter(value))
        values.append(f"({', '.join(marks)})")
    with connections[using].cursor() as cursor:
        cursor.execute(plan.head + ", ".join(values) + plan.tail, params)
        rows = cursor.fetchall()
    attname, convert = plan.key
    return [{attname: convert(key)} for (key,) in rows]
