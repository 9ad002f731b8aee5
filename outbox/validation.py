"""Checks an outbox row passes before anything is written."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.exceptions import InvalidOutboxMessage

if TYPE_CHECKING:
    from outbox.models import OutboxBase

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1


def validate_message(row: OutboxBase) -> None:
    """Raise InvalidOutboxMessage, naming the problem, if the row must not be saved."""
    for field in ("shard_scope", "category", "shard_identifier", "object_identifier"):
        _check_integer(row, field)
    registry.check_pair(row.shard_scope, row.category)
    _check_payload(row)


def _check_integer(row: OutboxBase, field: str) -> None:
    value = getattr(row, field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOutboxMessage(f"{field} must be an integer, got {value!r}.")
    if not BIGINT_MIN <= value <= BIGINT_MAX:
        raise InvalidOutboxMessage(f"{field}={value} does not fit a signed 64-bit column.")


def _check_payload(row: OutboxBase) -> None:
    try:
        # allow_nan=False: NaN and infinity are not JSON, and PostgreSQL would reject
        # them mid-transaction, leaving the caller's transaction broken.
        encoded = json.dumps(row.payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidOutboxMessage(
            f"payload of category {row.category} is not JSON-serialisable: {exc}"
        ) from exc
    limit = outbox_settings.MAX_PAYLOAD_BYTES
    size = len(encoded.encode())
    if limit and size > limit:
        raise InvalidOutboxMessage(
            f"payload of category {row.category} is {size} bytes, over "
            f"OUTBOX_MAX_PAYLOAD_BYTES={limit}."
        )
