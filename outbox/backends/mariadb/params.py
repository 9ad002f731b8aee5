"""Parameters of the MariaDB fast path's statements, and the decoding of what it reads.

Shard keys and failures go as JSON documents, opened by `JSON_TABLE`: one parameter,
however many shards, far cheaper to bind than thousands of placeholders.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from outbox.backends.base import FailedGroup, Lease
from outbox.backends.reading import MessageReader
from outbox.models import OutboxBase
from outbox.shards import ShardKey

# About the largest JSON document one statement carries: its text, escaped, must stay
# well inside max_allowed_packet (16 MiB by default). A failed group's error and
# traceback alone may take 24 kB, so the failures of a wide batch go in chunks.
DOCUMENT_CHARS = 4_000_000


def key_json(keys: Iterable[ShardKey]) -> str:
    return json.dumps([[key.region_name, key.shard_scope, key.shard_identifier] for key in keys])


def micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def ours(model: type[OutboxBase], lease: Lease, **more: Any) -> dict[str, Any]:
    """Parameters naming the lease: the outbox table's label and the token."""
    return {"label": model._meta.label_lower, "token": lease.token, **more}


def attempt_documents(failed: Sequence[FailedGroup], dead: Sequence[FailedGroup]) -> Iterator[str]:
    """The failed and dead groups as JSON documents of about DOCUMENT_CHARS at most: per
    group its error, traceback, whether it is dead, and its rows (id, retry delay in
    microseconds, and the receivers done on the group's newest row only, else null)."""
    chunk: list[str] = []
    size = 0
    for group, is_dead in [(f, 0) for f in failed] + [(f, 1) for f in dead]:
        newest = max(group.row_delays, default=0)
        rows = [
            [row_id, micros(delay), group.delivered_to if row_id == newest else None]
            for row_id, delay in group.row_delays.items()
        ]
        item = json.dumps([group.error, group.traceback, is_dead, rows])
        if chunk and size + len(item) > DOCUMENT_CHARS:
            yield "[" + ",".join(chunk) + "]"
            chunk, size = [], 0
        chunk.append(item)
        size += len(item)
    if chunk:
        yield "[" + ",".join(chunk) + "]"


def back_off_document(failed: Sequence[FailedGroup]) -> str:
    """The failed shards and how long each backs off, in microseconds."""
    return json.dumps([[*group.shard, micros(group.block_seconds)] for group in failed])


def message_reader(model: type[OutboxBase], connection: BaseDatabaseWrapper) -> MessageReader:
    """How Django turns a read row into a message: `decode_json` for a stock JSONField,
    else each field's own converters (see `field_converter`)."""
    return MessageReader(model, connection)
