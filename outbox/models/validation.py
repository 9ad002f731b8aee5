"""Checks an outbox row passes before anything is written.

Every check runs before any SQL, so a refused row leaves the caller's transaction usable
on every database. The rules are the same on every database: a row accepted on SQLite
in development is accepted by PostgreSQL and MariaDB in production.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from typing import Any, ClassVar, Protocol

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models.options import Options

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.exceptions import InvalidOutboxMessage
from outbox.headers import allowed_credentials, check_writer_header, control_character


class OutboxRow(Protocol):
    """What the checks read of an outbox row (`outbox.models.OutboxBase`, which imports
    this module to validate itself)."""

    _meta: ClassVar[Options[Any]]
    shard_fields: ClassVar[tuple[str, ...]]
    shard_scope: int
    category: int
    headers: Any
    payload: Any


BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1
_BIGINT = (BIGINT_MIN, BIGINT_MAX)

# MariaDB's JSON_VALID (the CHECK of its JSON columns) refuses 32 levels of nesting.
MAX_PAYLOAD_DEPTH = 31

_INTEGER_FIELDS = ("shard_scope", "category", "shard_identifier", "object_identifier")
# Escapes that may need a closer look: \u0000 (PostgreSQL's jsonb refuses it) and UTF-16
# surrogates (PostgreSQL and MariaDB refuse lone ones; paired ones are fine).
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|d[89a-f])")
_ESCAPE = re.compile(r"\\(?:u([0-9a-f]{4})|.)")
_LONE_SURROGATE = "a lone surrogate, which is not valid Unicode"
_CONTAINERS = (dict, list, tuple)


def validate_message(row: OutboxRow) -> str:
    """Raise InvalidOutboxMessage, naming the problem, if the row must not be saved;
    else return its payload as JSON text, encoded with the payload field's encoder."""
    integers, texts = _columns(type(row))
    for field, low, high in integers:
        _check_integer(row, field, low, high)
    for field in texts:
        _check_text(row, field)
    registry.check_pair(row.shard_scope, row.category)
    if row.headers is not None:
        _check_headers(row.headers)
    return _check_payload(row)


@cache
def _columns(
    model: type[OutboxRow],
) -> tuple[tuple[tuple[str, int, int], ...], tuple[str, ...]]:
    """The integer columns checked, each with the values every supported database
    stores in it; and the shard columns that are not among them (region_name)."""
    from django.db.backends.base.operations import BaseDatabaseOperations

    ranges = BaseDatabaseOperations.integer_field_ranges
    integers = tuple(
        (field, *ranges.get(model._meta.get_field(field).get_internal_type(), _BIGINT))
        for field in _INTEGER_FIELDS
    )
    return integers, tuple(f for f in model.shard_fields if f not in _INTEGER_FIELDS)


def _check_integer(row: OutboxRow, field: str, low: int, high: int) -> None:
    value = getattr(row, field)
    if value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidOutboxMessage(f"{field} must be an integer, got {value!r}.")
    if not low <= value <= high:
        raise InvalidOutboxMessage(
            f"{field}={value} does not fit its column, which holds {low} to {high}."
        )


def _check_text(row: OutboxRow, field: str) -> None:
    """Text shard columns (region_name): no control character (it travels in the
    relays' ``outbox-shard`` header), no lone surrogates, on any database."""
    value = getattr(row, field)
    if not isinstance(value, str):
        return  # integer columns are checked above
    if "\x00" in value:
        raise InvalidOutboxMessage(f"{field} {value!r} contains a NUL character.")
    character = control_character(value)
    if character is not None:
        raise InvalidOutboxMessage(
            f"{field} {value!r} contains a control character ({character!r}): it is sent "
            "in the relays' outbox-shard header, which cannot carry it."
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidOutboxMessage(
            f"{field} {value!r} is not valid Unicode (it has a lone surrogate)."
        ) from None


def _check_headers(headers: object) -> None:
    """Headers are a flat dict of text to text, small enough to travel as a broker's
    or an HTTP request's headers, and none a transport reserves (`outbox.headers`)."""
    if not isinstance(headers, dict):
        raise InvalidOutboxMessage(
            f"headers must be a dict of str to str (or None), got {type(headers).__name__}."
        )
    size = 0
    allowed = allowed_credentials()
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidOutboxMessage(f"header name {name!r} is not a non-empty str.")
        if not isinstance(value, str):
            raise InvalidOutboxMessage(
                f"header {name!r} must have a str value, got {type(value).__name__}: "
                "convert it (str(), isoformat(), json.dumps()) before writing."
            )
        for text in (name, value):
            if "\x00" in text:
                raise InvalidOutboxMessage(f"header {name!r} contains a NUL character.")
            try:
                size += len(text.encode())
            except UnicodeEncodeError:
                raise InvalidOutboxMessage(
                    f"header {name!r} is not valid Unicode (it has a lone surrogate)."
                ) from None
        check_writer_header(name, value, allowed)
    limit = outbox_settings.MAX_HEADERS_BYTES
    if limit and size > limit:
        raise InvalidOutboxMessage(
            f"headers are {size} bytes, over OUTBOX_MAX_HEADERS_BYTES={limit}: "
            "headers are for small values (an id, a tenant, a version); put data in the "
            "payload."
        )


def _category(row: OutboxRow) -> str:
    """The row's category as errors name it: by its declared name (read only when a row
    is refused, so a row that passes pays nothing for it)."""
    return registry.category_name(row.category)


def _check_payload(row: OutboxRow) -> str:
    """Check the payload's JSON text and return it (the deferred writer keeps it, so a
    held row is written as it was when saved)."""
    try:
        encoded = _payload_encoder(type(row))(row.payload)
    except RecursionError:
        raise InvalidOutboxMessage(
            f"payload of category {_category(row)} is nested more than "
            f"{MAX_PAYLOAD_DEPTH} levels deep."
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidOutboxMessage(
            f"payload of category {_category(row)} is not JSON-serialisable: {exc}"
            f"{_encoder_hint(type(row), exc)}"
        ) from exc
    limit = outbox_settings.MAX_PAYLOAD_BYTES
    # A character is at most 4 bytes of UTF-8: short texts need no encoding to be sure.
    if limit and len(encoded) * 4 > limit and len(encoded.encode()) > limit:
        raise InvalidOutboxMessage(
            f"payload of category {_category(row)} is {len(encoded.encode())} bytes, over "
            f"OUTBOX_MAX_PAYLOAD_BYTES={limit}."
        )
    problem = "\\u" in encoded and _SUSPECT_ESCAPE.search(encoded) and _bad_escape(encoded)
    if problem:
        raise InvalidOutboxMessage(f"payload of category {_category(row)} contains {problem}.")
    if encoded.count("[") + encoded.count("{") > MAX_PAYLOAD_DEPTH and _too_deep(row.payload):
        raise InvalidOutboxMessage(
            f"payload of category {_category(row)} is nested more than "
            f"{MAX_PAYLOAD_DEPTH} levels deep (MariaDB's JSON limit)."
        )
    return encoded


@cache
def _payload_encoder(model: type[OutboxRow]) -> Callable[[Any], str]:
    """How the payload becomes JSON text, as json.dumps would make it with the payload
    field's own encoder class (as Django uses it). allow_nan=False: NaN and infinity are
    not JSON, and PostgreSQL would reject them mid-transaction, leaving the caller's
    transaction broken. The standard encoders keep no state between calls, so one
    instance serves every call; an encoder of the project's own is made for each."""
    encoder = getattr(model._meta.get_field("payload"), "encoder", None) or json.JSONEncoder
    if encoder in (json.JSONEncoder, DjangoJSONEncoder):
        return encoder(allow_nan=False).encode
    return lambda payload: encoder(allow_nan=False).encode(payload)


def _encoder_hint(model: type[OutboxRow], exc: Exception) -> str:
    """For a value of a type JSON lacks (a datetime, a Decimal, a UUID), the two ways
    out: convert it, or encode the table's payloads with an encoder that knows it."""
    if not (isinstance(exc, TypeError) and str(exc).startswith("Object of type")):
        return ""  # NaN, a circular reference, a key JSON cannot hold: no encoder helps
    encoder = getattr(model._meta.get_field("payload"), "encoder", None)
    if encoder is not None:
        return (
            f". The encoder of {model.__name__}.payload ({encoder.__qualname__}) cannot "
            "encode it either: convert the value to a JSON type first."
        )
    return (
        ". Convert the value to a JSON type first (a datetime's isoformat(), say), or "
        "write to an outbox table whose payload field has an encoder: a concrete "
        "subclass of outbox.models.OutboxBase declaring "
        "`payload = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)` "
        "(see docs/howto/custom-table.md)."
    )


def _bad_escape(encoded: str) -> str | None:
    """Name the first \\u0000 or unpaired surrogate among the escapes of a JSON text.

    In json.dumps output a backslash only ever starts an escape, so scanning escapes from
    the left never mistakes an escaped backslash followed by "u0000" for one.
    """
    high_end = None  # where an unpaired high surrogate ended
    for match in _ESCAPE.finditer(encoded):
        code = int(match.group(1), 16) if match.group(1) else None
        if high_end is not None:
            if match.start() == high_end and code is not None and 0xDC00 <= code <= 0xDFFF:
                high_end = None
                continue
            return _LONE_SURROGATE
        if code == 0:
            return "a NUL character (\\u0000), which PostgreSQL cannot store"
        if code is not None and 0xD800 <= code <= 0xDBFF:
            high_end = match.end()
        elif code is not None and 0xDC00 <= code <= 0xDFFF:
            return _LONE_SURROGATE
    return _LONE_SURROGATE if high_end is not None else None


def _too_deep(payload: object) -> bool:
    """Whether arrays and objects nest more than MAX_PAYLOAD_DEPTH deep in the payload.

    Walked level by level on the Python value (json.dumps accepted it, so it holds only
    dicts, lists, tuples and scalars), following containers only.
    """
    level: list[Any] = [payload] if isinstance(payload, _CONTAINERS) else []
    for _ in range(MAX_PAYLOAD_DEPTH):
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, _CONTAINERS)
        ]
        if not level:
            return False
    return True
