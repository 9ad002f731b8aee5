"""The deferred writer's last INSERT, the one that carries the COMMIT: rendered here.

`bulk_create` builds model instances and compiles a query for every call, which costs a
one-row transaction more than the INSERT itself does in the database. The statement's
text for a table is always the same apart from which columns take their database
default, so it is put together from a cached plan and the held rows' snapshots (field
values by attname, the payload as the JSON text validation checked). Values go in as
`bulk_create` would send them, more cheaply where Django's own fields allow: `NULL`
for None, digits for an int in an integer field, `''` for an empty text, the payload's
JSON text as it is, `DEFAULT` where a value is its database default, and every other
value as a parameter made by its field's `get_db_prep_save`. The statement returns the
primary key and the database defaults, converted as a queryset would convert them (a
flushed row is gone by the time anything could read them back). Used only where the
COMMIT can ride along (PostgreSQL with client-side binding, whose multi-row
`INSERT ... RETURNING` returns rows in the order given).

It runs on one driver cursor kept per driver connection, made by the database's
COMMIT-with-INSERT (`outbox.cursors.CommitWithInsert`: on PostgreSQL, one that loads
timestamps in C), wrapped in Django's cursor wrapper for each statement (so query
logging and execute wrappers see it as usual): making a cursor and teaching it to load
timestamps cost a one-row write more than rendering its statement does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import (
    NOT_PROVIDED,
    BigIntegerField,
    CharField,
    DateField,
    DateTimeField,
    Field,
    IntegerField,
    JSONField,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallIntegerField,
    TextField,
)
from django.db.models.expressions import DatabaseDefault

from outbox.cursors import CommitWithInsert
from outbox.internals import Convert, as_is, column_converter, kept_cursor

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from outbox.models import OutboxBase

Snapshot = dict[str, Any]  # a held row's field values by attname; the payload as JSON text


# How a column's value goes into the statement (see `_kind`).
_AS_PARAMETER, _INTEGER, _TEXT, _JSON_TEXT = range(4)
_INTEGER_FIELDS = (
    IntegerField,
    BigIntegerField,
    SmallIntegerField,
    PositiveIntegerField,
    PositiveBigIntegerField,
    PositiveSmallIntegerField,
)


@dataclass(frozen=True)
class _Plan:
    # (attname, field, how its value goes in, whether None is written NULL), per column
    columns: tuple[tuple[str, Field[Any, Any], int, bool], ...]
    head: str  # INSERT INTO "table" ("a", "b", ...) VALUES
    tail: str  # RETURNING "id", the columns with a database default
    returned: tuple[str, ...]  # the attnames of the returned columns, in order
    timestamps: tuple[str, ...]  # those of them that are timestamptz (PostgreSQL)
    converted: tuple[tuple[str, Convert], ...]  # those with converters: (attname, them)
    # Left to bulk_create: a field computes or renders its own value at save time
    # (pre_save, get_placeholder), or the key is not one the database assigns.
    compiled_elsewhere: bool


@cache
def _plan(model: type[OutboxBase], using: str) -> _Plan:
    connection = connections[using]
    quote = connection.ops.quote_name
    meta = model._meta
    fields = tuple(f for f in meta.concrete_fields if not f.primary_key)
    returned = (meta.pk, *(f for f in fields if f.db_default is not NOT_PROVIDED))
    columns = ", ".join(quote(str(f.column)) for f in fields)
    converters = ((f.attname, column_converter(model, f.name, connection)) for f in returned)
    return _Plan(
        columns=tuple(
            (f.attname, f, _kind(f), type(f).__module__.startswith("django.db.models.fields"))
            for f in fields
        ),
        head=f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ",
        tail=" RETURNING " + ", ".join(quote(str(f.column)) for f in returned),
        returned=tuple(f.attname for f in returned),
        timestamps=tuple(
            f.attname
            for f in returned
            if connection.vendor == "postgresql"
            and f.db_type(connection) == "timestamp with time zone"
        ),
        converted=tuple((name, convert) for name, convert in converters if convert is not as_is),
        # A payload field of the project's own (a JSONField subclass) makes its own
        # parameter from the decoded payload: bulk_create's.
        compiled_elsewhere=any(not _plain(f) for f in fields)
        or type(meta.get_field("payload")) is not JSONField
        or not getattr(meta.pk, "db_returning", False),
    )


def _kind(field: Field[Any, Any]) -> int:
    """Django's own integer and text fields take an int or an empty string as they are,
    written into the statement; the payload goes as the JSON text validation made of
    it; every other value is a parameter, as `get_db_prep_save` makes it."""
    if type(field) in _INTEGER_FIELDS:
        return _INTEGER
    if type(field) in (TextField, CharField):
        return _TEXT
    if field.attname == "payload" and type(field) is JSONField:
        return _JSON_TEXT
    return _AS_PARAMETER


def _plain(field: Field[Any, Any]) -> bool:
    """Whether saving the field sends its value as it is (no pre_save of its own, no
    placeholder of its own)."""
    if hasattr(field, "get_placeholder"):
        return False
    pre_save = type(field).pre_save
    if pre_save in (DateField.pre_save, DateTimeField.pre_save):
        return not (field.auto_now or field.auto_now_add)  # type: ignore[attr-defined]
    return pre_save is Field.pre_save


def insert(
    model: type[OutboxBase],
    snapshots: list[Snapshot],
    connection: BaseDatabaseWrapper,
    wrapper: CommitWithInsert | None = None,
) -> list[Snapshot] | None:
    """INSERT the held rows of `snapshots` (new rows of `model`) in one statement; return,
    per row, its primary key and database defaults by attname, converted as a queryset
    converts them. None, with nothing sent, when a value is an expression (`Now()`,
    `F(...)`) or a field computes or renders its own value: those are `bulk_create`'s.
    `wrapper`, an execute wrapper, is applied to this statement alone (the one that
    sends the COMMIT along)."""
    plan = _plan(model, connection.alias)
    if plan.compiled_elsewhere:
        return None
    params: list[Any] = []
    values = []
    for snapshot in snapshots:
        marks = _marks(plan, snapshot, params, connection)
        if marks is None:
            return None
        values.append(f"({', '.join(marks)})")
    sql = plan.head + ", ".join(values) + plan.tail
    cursor = _cursor(connection, wrapper)
    if wrapper is None:
        cursor.execute(sql, params)
    else:
        run = lambda sql, params, many, context: cursor.execute(sql, params)  # noqa: E731
        wrapper(run, sql, params, False, {"connection": connection, "cursor": cursor})
    with connection.wrap_database_errors:
        rows = cursor.cursor.fetchall()  # the driver's: no error wrapper made per call
    return _returned(plan, rows, connection.timezone if plan.timestamps else None)


def _marks(
    plan: _Plan, snapshot: Snapshot, params: list[Any], connection: BaseDatabaseWrapper
) -> list[str] | None:
    """How each value of one row goes into the statement (its parameters are added to
    `params`); None for a value that is an expression. Runs once per column of every
    held row, so the usual values (ints, None, '', a database default) are decided by
    their class alone."""
    marks = []
    for attname, field, kind, none_is_null in plan.columns:
        value = snapshot[attname]
        cls = value.__class__
        if value is None and none_is_null:
            marks.append("NULL")
        elif cls is DatabaseDefault:
            marks.append("DEFAULT")
        elif kind == _INTEGER and cls is not bool and isinstance(value, int):
            marks.append(str(int(value)))  # an int renders only digits and a sign
        elif kind == _TEXT and value == "":
            marks.append("''")
        elif kind == _JSON_TEXT:
            if value == "null":
                marks.append("NULL")  # a payload of None: SQL NULL, as Django stores it
            else:
                marks.append("%s")
                params.append(value)  # the JSON text validation made
        elif isinstance(value, DatabaseDefault):
            marks.append("DEFAULT")
        elif hasattr(value, "resolve_expression"):
            return None
        else:
            marks.append("%s")
            params.append(field.get_db_prep_save(value, connection))
    return marks


def _returned(plan: _Plan, rows: list[Any], timezone: Any) -> list[Snapshot]:
    """Per returned row, its values by attname as Django would have loaded them: a
    timestamp in the session's wall time (which is the connection's time zone) with the
    connection's tzinfo, or naive without USE_TZ; then the fields' converters."""
    written = []
    for row in rows:
        values = dict(zip(plan.returned, row, strict=True))
        for attname in plan.timestamps:
            value = values[attname]
            if value is not None:
                values[attname] = value.replace(tzinfo=timezone)
        for attname, convert in plan.converted:
            values[attname] = convert(values[attname])
        written.append(values)
    return written


def _cursor(connection: BaseDatabaseWrapper, wrapper: CommitWithInsert | None) -> Any:
    """The cursor `insert` runs on, kept for the connection
    (`outbox.internals.kept_cursor`): the one the database's COMMIT-with-INSERT makes
    (which may load timestamps its own way; `_returned` then sets the tzinfo as Django's
    loader does), else a plain one."""
    make = _plain_cursor if wrapper is None else wrapper.cursor
    return kept_cursor(connection, "insert", make)


def _plain_cursor(driver: Any) -> Any:
    return driver.cursor()
