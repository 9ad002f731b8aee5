"""Where a relay sends a message: a name (an AMQP routing key, a Redis stream) made from
a template of the message's fields, or returned by a callable of the message.

Template fields: ``{category}`` and ``{scope}`` (their names in lower case),
``{shard_identifier}``, ``{object_identifier}`` and ``{region_name}`` (empty outside a
control outbox); e.g. ``"{scope}.{category}"`` gives ``organization.audit_event``.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable
from typing import Any

from outbox.exceptions import OutboxConfigurationError
from outbox.relays.base import Message

__all__ = ["FIELDS", "Destination", "template_fields"]

FIELDS = ("category", "scope", "shard_identifier", "object_identifier", "region_name")


def template_fields(message: Message) -> dict[str, Any]:
    """The values a destination template may name, for one message."""
    return {
        "category": message.category.name.lower(),
        "scope": message.scope.name.lower(),
        "shard_identifier": message.shard_identifier,
        "object_identifier": message.object_identifier,
        "region_name": message.region_name or "",
    }


class Destination:
    """A template (``str.format`` syntax over `FIELDS`) or a callable taking the
    `Message` and returning the name. `what` names the argument in error messages."""

    def __init__(self, spec: str | Callable[[Message], str], what: str) -> None:
        if not isinstance(spec, str) and not callable(spec):
            raise OutboxConfigurationError(
                f"{what} must be a template string or a callable taking the message, "
                f"not {spec!r} ({type(spec).__name__})."
            )
        self.spec = spec
        self.what = what

    def __call__(self, message: Message) -> str:
        if isinstance(self.spec, str):
            return self.spec.format_map(template_fields(message))
        name = self.spec(message)
        if not isinstance(name, str):
            raise TypeError(f"{self.what} callable returned {name!r}, not a str")
        return name

    def problems(self) -> list[str]:
        """What is wrong with a template: a field it names that no message has, or
        braces that do not parse. A callable is taken as it is."""
        if not isinstance(self.spec, str):
            return []
        try:
            parsed = list(string.Formatter().parse(self.spec))
        except ValueError as error:
            return [f"{self.what} template {self.spec!r} does not parse: {error}."]
        named = {_root(field) for _, field, _, _ in parsed if field is not None}
        unknown = sorted(named - set(FIELDS))
        if unknown:
            return [
                f"{self.what} template {self.spec!r} names {_braced(unknown)}; a "
                f"template may name {_braced(FIELDS)}."
            ]
        return []


def _braced(fields: Iterable[str]) -> str:
    return ", ".join("{" + field + "}" for field in fields)


def _root(field: str) -> str:
    """The name a replacement field starts with (``shard`` in ``{shard.x}``)."""
    for mark in ".[":
        field = field.split(mark, 1)[0]
    return field
