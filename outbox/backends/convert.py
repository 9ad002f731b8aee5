"""Turning columns read by hand-written SQL into the values a queryset would give, and
a group's newest row into its Message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField

from outbox.backends.base import Group, Message
from outbox.columns import Convert, column_converter
from outbox.models import OutboxBase

__all__ = ["Convert", "MessageReader", "field_converter"]


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


class MessageReader:
    """Builds a group's Message from the columns a fast path read of its newest row, in
    this order: payload, date_added, scheduled_for, delivered_to, message_id, headers;
    each value turned into what a queryset would give (JSON through `stock_json` where
    the field is a stock JSONField)."""

    def __init__(
        self, model: type[OutboxBase], connection: BaseDatabaseWrapper, stock_json: Convert
    ) -> None:
        def convert(name: str) -> Convert:
            return field_converter(model, name, connection, stock_json)

        self._payload = convert("payload")
        self._time = convert("date_added")  # and scheduled_for, alike
        self._message_id = convert("message_id")
        self._headers = convert("headers")

    def message(self, group: Group, columns: Sequence[Any]) -> Message:
        payload, date_added, scheduled_for, done, message_id, headers = columns
        return Message(
            group,
            self._payload(payload),
            None if date_added is None else self._time(date_added),
            None if scheduled_for is None else self._time(scheduled_for),
            done,
            None if message_id is None else self._message_id(message_id),
            None if headers is None else self._headers(headers),
        )
