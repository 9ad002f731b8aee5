"""Turning a column read or returned by hand-written SQL into the value a queryset gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

Convert = Callable[[Any], Any]


def column_converter(model: type[Model], name: str, connection: BaseDatabaseWrapper) -> Convert:
    """How Django turns column `name` of `model` into a value, as one function: the
    backend's converters, then the field's own (a custom decoder, a time zone)."""
    column = model._meta.get_field(name).get_col(model._meta.db_table)  # type: ignore[union-attr]
    converters = [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
    if not converters:
        return as_is

    def convert(value: Any) -> Any:
        for function in converters:
            value = function(value, column, connection)
        return value

    return convert


def as_is(value: Any) -> Any:
    """The converter of a column Django loads as the driver returns it."""
    return value
