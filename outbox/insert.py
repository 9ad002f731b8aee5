"""The write path's INSERT, without the ORM's per-call query compilation.

An outbox row is written inside the caller's transaction, next to their own model save;
compiling a fresh INSERT through the ORM every time costs several times what the
statement itself costs the database. Here the statement text is built once per table,
database and set of database-defaulted columns, and only the values are prepared
per row. Anything unusual (an update, a given primary key, multi-table inheritance, a
database that cannot return the new key) goes through Django's own `save()`.

`insert_prepared` writes several rows of one table in one statement (the rows an
`outbox_context` held back until its commit, see `outbox.deferred`, each prepared when
it was saved); on PostgreSQL with client-side binding it can also carry the COMMIT in
the same round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, lru_cache
from itertools import groupby
from typing import TYPE_CHECKING, Any

from django.db import connections, models
from django.db.models import signals
from django.db.models.expressions import DatabaseDefault

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import Field

    from outbox.models import OutboxBase

    # (table, which columns take their database default, the row, its parameters)
    Prepared = tuple[type[OutboxBase], tuple[bool, ...], OutboxBase, list[Any]]

_MISSING = object()
_JSON_TEXT = object()
_SIMPLE = object()
_GENERIC = object()
# Where validation leaves the payload's JSON text for the INSERT (see _prepare).
PAYLOAD_JSON = "_outbox_payload_json"
_PLAIN_TYPES: dict[type, type] = {
    models.IntegerField: int,
    models.BigIntegerField: int,
    models.PositiveIntegerField: int,
    models.TextField: str,
    models.CharField: str,
}

# Rows per multi-row INSERT at most, below every database's placeholder limit.
MAX_ROWS_PER_STATEMENT = 500


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
    insert_prepared([prepare(row, using)], using)


def insert_prepared(prepared: Sequence[Prepared], using: str, *, then_commit: bool = False) -> None:
    """INSERT rows `prepare` took (from rows `can_insert_directly` accepted), in their
    order, and set their keys.

    Consecutive rows of one table with the same database-defaulted columns share one
    statement. `then_commit` appends COMMIT to the last statement (only where
    `can_commit_with_insert` said so): the transaction then ends with it.
    """
    connection = connections[using]
    runs = [
        chunk
        for _, run in groupby(prepared, key=lambda item: item[:2])
        for chunk in _chunks(list(run), connection)
    ]
    with connection.cursor() as cursor:
        for index, run in enumerate(runs):
            model, defaulted = run[0][0], run[0][1]
            sql = _statement(model, using, defaulted, len(run))
            if then_commit and index == len(runs) - 1:
                sql += "; COMMIT"
            cursor.execute(sql, [param for item in run for param in item[3]])
            for item, (pk,) in zip(run, cursor.fetchall(), strict=True):
                _saved(item[2], pk, defaulted, using)


def can_commit_with_insert(using: str) -> bool:
    """Whether `insert_prepared(..., then_commit=True)` works here: psycopg 3 with client-side
    binding sends one multi-statement query, and its own commit afterwards finds the
    transaction already ended and does nothing."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3 and not connection.settings_dict.get("OPTIONS", {}).get(
        "server_side_binding"
    )


def prepare(row: OutboxBase, using: str) -> Prepared:
    """The row's INSERT parameters, taken now (pre_save is sent here, as save() would):
    the row is written with these values even if it changes before the INSERT."""
    model = type(row)
    if signals.pre_save.has_listeners(model):
        signals.pre_save.send(model, instance=row, raw=False, using=using, update_fields=None)
    values = row.__dict__
    defaulted: list[bool] = []
    params: list[Any] = []
    for field, kind, null in _columns(model):
        value = values.get(field.attname, _MISSING)
        if kind is not _GENERIC:
            if type(value) is DatabaseDefault:
                defaulted.append(True)
                continue
            if value is None and null:
                defaulted.append(False)
                params.append(None)
                continue
            if kind is int or kind is str:
                if isinstance(value, kind) and not isinstance(value, bool):
                    # Stock int and text columns take the value as it is (validated
                    # already); int() turns enum members into plain ints.
                    defaulted.append(False)
                    params.append(int(value) if kind is int else value)
                    continue
            elif kind is _JSON_TEXT:
                text = values.pop(PAYLOAD_JSON, None)
                if text is not None and value is not None:
                    # Encoded once, by validation, with the field's encoder: the text
                    # Django would send, written as it was when the row was saved.
                    defaulted.append(False)
                    params.append(text)
                    continue
        value = field.pre_save(row, True)
        default = isinstance(value, DatabaseDefault)
        defaulted.append(default)
        if not default:
            params.append(field.get_db_prep_save(value, connection=connections[using]))
    return model, tuple(defaulted), row, params


def _saved(row: OutboxBase, pk: int, defaulted: tuple[bool, ...], using: str) -> None:
    model = type(row)
    row.pk = pk
    # Database defaults stay unknown until read back, as Django leaves the ones it did
    # not return.
    values = row.__dict__
    for attname in _defaulted_attnames(model, defaulted):
        values.pop(attname, None)
    row._state.adding = False
    row._state.db = using
    if signals.post_save.has_listeners(model):
        signals.post_save.send(
            model, instance=row, created=True, update_fields=None, raw=False, using=using
        )


def _chunks(run: list[Prepared], connection: BaseDatabaseWrapper) -> list[list[Prepared]]:
    """Split a run into statements the database accepts (placeholder limits), or into
    single rows where it cannot return the keys of a multi-row INSERT."""
    if len(run) == 1:
        return [run]
    if connection.features.can_return_rows_from_bulk_insert:
        fields = list(_fields(run[0][0]))
        size = max(1, min(MAX_ROWS_PER_STATEMENT, connection.ops.bulk_batch_size(fields, run)))
    else:
        size = 1
    return [run[start : start + size] for start in range(0, len(run), size)]


@cache
def _columns(model: type[OutboxBase]) -> tuple[tuple[Field[Any, Any], object, bool], ...]:
    """Each field; how its value is read: `int` or `str` for stock integer and text
    columns (taken unchanged), `_JSON_TEXT` for a stock JSONField (the text validation
    encoded), `_SIMPLE` for other fields whose pre_save only reads the value, else
    `_GENERIC`; and whether None goes in as NULL unchanged (a JSON field's None may mean
    JSON null, so it goes through the field)."""
    columns = []
    for field in _fields(model):
        kind: object = _PLAIN_TYPES.get(type(field), _GENERIC)
        if type(field) is models.JSONField:
            kind = _JSON_TEXT
        elif kind is _GENERIC and _reads_value(field):
            kind = _SIMPLE
        null = field.null and not isinstance(field, models.JSONField)
        columns.append((field, kind, null))
    return tuple(columns)


def _reads_value(field: Field[Any, Any]) -> bool:
    """Whether the field's pre_save on insert just returns the attribute's value."""
    if isinstance(field, models.DateField):  # DateTimeField too: auto_now(_add) sets it
        return not (field.auto_now or field.auto_now_add)
    return type(field).pre_save is models.Field.pre_save


@lru_cache(maxsize=512)
def _defaulted_attnames(model: type[OutboxBase], defaulted: tuple[bool, ...]) -> tuple[str, ...]:
    return tuple(
        field.attname for field, default in zip(_fields(model), defaulted, strict=True) if default
    )


@cache
def _fields(model: type[OutboxBase]) -> tuple[Field[Any, Any], ...]:
    return tuple(field for field in model._meta.concrete_fields if not field.primary_key)


@lru_cache(maxsize=512)
def _statement(model: type[OutboxBase], using: str, defaulted: tuple[bool, ...], rows: int) -> str:
    """INSERT ... VALUES (...)[, (...)] RETURNING pk; database-defaulted columns are left
    out, so they take their default (SQLite has no DEFAULT keyword in VALUES)."""
    quote = connections[using].ops.quote_name
    columns = [
        quote(str(field.column))
        for field, default in zip(_fields(model), defaulted, strict=True)
        if not default
    ]
    table = quote(model._meta.db_table)
    pk = quote(str(model._meta.pk.column if model._meta.pk else "id"))
    values = ", ".join([f"({', '.join(['%s'] * len(columns))})"] * rows)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values} RETURNING {pk}"
