"""Turning a column read by hand-written SQL into the value a queryset would give."""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField

from outbox.columns import Convert, column_converter
from outbox.models import OutboxBase

__all__ = ["Convert", "field_converter"]


def field_converter(
    model: type[OutboxBase], name: str, connection: BaseDatabaseWrapper, stock_json: Convert
) -> Convert:
    """How Django turns column `name` of `model` into a value, as one function.

    A stock JSONField without a decoder takes `stock_json`, the backend's fast decoder;
    any other field (a custom decoder, a JSONField subclass, a datetime needing its time
    zone) goes through its own converters, as a queryset would.
    """
    field = model._meta.get_field(name)
    if type(field) is JSONField and field.decoder is None:
        return stock_json
    return column_converter(model, name, connection)
