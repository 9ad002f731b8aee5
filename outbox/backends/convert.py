"""Turning columns read by hand-written SQL into the values a queryset would give, and
a group's newest row into its Message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField

from outbox.backends.base import Group, Message
from outbox.internals import Convert, as_is, column_converter
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
    """Builds each group's Message from the columns a fast path read of its newest row,
    in this order: payload, date_added, scheduled_for, delivered_to, message_id,
    headers; each value turned into what a queryset would give (JSON through
    `stock_json` where the field is a stock JSONField)."""

    def __init__(
        self, model: type[OutboxBase], connection: BaseDatabaseWrapper, stock_json: Convert
    ) -> None:
        def convert(name: str) -> Convert | None:
            # None: the column is taken as read (`as_is`), with no call per row.
            function = field_converter(model, name, connection, stock_json)
            return None if function is as_is else function

        self._payload = convert("payload") or as_is
        self._time = convert("date_added")  # and scheduled_for, alike
        self._message_id = convert("message_id")
        self._headers = convert("headers")

    def attach(self, newest: Mapping[Group, Sequence[Any]], at: int) -> None:
        """Give each group of `newest` its Message, from its row's columns from `at` on.
        Runs once per message delivered, so converters the column does not need are
        skipped rather than called."""
        payload_of, time_of = self._payload, self._time
        id_of, headers_of = self._message_id, self._headers
        for group, row in newest.items():
            payload, date_added, scheduled_for, done, message_id, headers = row[at : at + 6]
            if time_of is not None:
                date_added = None if date_added is None else time_of(date_added)
                scheduled_for = None if scheduled_for is None else time_of(scheduled_for)
            if id_of is not None and message_id is not None:
                message_id = id_of(message_id)
            if headers is not None and headers_of is not None:
                headers = headers_of(headers)
            group.message = Message(
                group, payload_of(payload), date_added, scheduled_for, done, message_id, headers
            )
