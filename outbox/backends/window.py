"""Rows read into a window, shared by every backend: coalesced into groups, and the
columns read by hand-written SQL turned into the values a queryset would give, each
group's newest row into its Message. Pure Python: the backends run the statements."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField

from outbox.backends.base import Group, Message
from outbox.internals import Convert, as_is, column_converter
from outbox.models import OutboxBase
from outbox.shards import ShardKey

__all__ = ["Coalesced", "Convert", "MessageReader", "coalesce", "decode_json", "field_converter"]


_raw_decode = json.JSONDecoder().raw_decode


def decode_json(value: Any) -> Any:
    """The one JSON decoder of the fast paths, for a stock JSONField's column: what
    `json.loads` gives, without its two whitespace scans where the text has none around
    it (as PostgreSQL prints jsonb and Django writes JSON); other text and bytes go
    through `json.loads` itself (which raises as it would), anything else (a driver's
    own decoded value, None) is taken as it is."""
    if type(value) is str:
        try:
            decoded, end = _raw_decode(value)
        except ValueError:
            return json.loads(value)  # leading whitespace, or an error to raise as it would
        return decoded if end == len(value) else json.loads(value)
    return json.loads(value) if isinstance(value, bytes) else value


def field_converter(model: type[OutboxBase], name: str, connection: BaseDatabaseWrapper) -> Convert:
    """How Django turns column `name` of `model` into a value, as one function.

    A stock JSONField without a decoder takes `decode_json`; any other field (a custom
    decoder, a JSONField subclass, a datetime needing its time zone) goes through its own
    converters, as a queryset would.
    """
    field = model._meta.get_field(name)
    if type(field) is JSONField and field.decoder is None:
        return decode_json
    return column_converter(model, name, connection)


class MessageReader:
    """Builds each group's Message from the columns a fast path read of its newest row,
    in this order: payload, date_added, scheduled_for, delivered_to, message_id,
    headers; each value turned into what a queryset would give (JSON through
    `decode_json` where the field is a stock JSONField)."""

    def __init__(self, model: type[OutboxBase], connection: BaseDatabaseWrapper) -> None:
        def convert(name: str) -> Convert | None:
            # None: the column is taken as read (`as_is`), with no call per row.
            function = field_converter(model, name, connection)
            return None if function is as_is else function

        self._payload = convert("payload") or as_is
        # A stock JSONField's texts are decoded together, once per window (`_decode_all`).
        self._payload_stock = self._payload is decode_json
        self._time = convert("date_added")  # and scheduled_for, alike
        self._message_id = convert("message_id")
        self._headers = convert("headers")

    def attach(self, newest: Mapping[Group, Sequence[Any]], at: int) -> None:
        """Give each group of `newest` its Message, from its row's columns from `at` on.
        Runs once per message delivered, so converters the column does not need are
        skipped rather than called."""
        time_of, id_of, headers_of = self._time, self._message_id, self._headers
        payloads = [row[at] for row in newest.values()]
        if self._payload_stock:
            payloads = _decode_all(payloads)
        elif self._payload is not as_is:
            payloads = list(map(self._payload, payloads))
        for (group, row), payload in zip(newest.items(), payloads, strict=True):
            date_added, scheduled_for, done, message_id, headers = row[at + 1 : at + 6]
            if time_of is not None:
                date_added = None if date_added is None else time_of(date_added)
                scheduled_for = None if scheduled_for is None else time_of(scheduled_for)
            if id_of is not None and message_id is not None:
                message_id = id_of(message_id)
            if headers is not None and headers_of is not None:
                headers = headers_of(headers)
            group.message = Message(
                group, payload, date_added, scheduled_for, done, message_id, headers
            )


def _decode_all(values: list[Any], one: Convert = decode_json) -> list[Any]:
    """Each value as `one` (`decode_json`) gives it, the JSON texts decoded in one
    call: a column of a stock JSONField holds valid JSON only (PostgreSQL's jsonb, the
    JSON_VALID check elsewhere), so the texts joined by commas inside brackets are an
    array of exactly those values. Decoding a window's payloads together saves most of
    what a decoder call per message costs. Anything else (NULL, bytes) goes through
    `one`, and so does every value when the joined decode fails: `one` raises as it
    would have."""
    texts = [value for value in values if type(value) is str]
    if len(texts) < 2:
        return list(map(one, values))
    try:
        decoded = _raw_decode("[" + ",".join(texts) + "]")[0]
    except ValueError:
        return list(map(one, values))
    if len(decoded) != len(texts):
        return list(map(one, values))
    if len(texts) == len(values):
        return decoded  # type: ignore[no-any-return]
    taken = iter(decoded)
    return [next(taken) if type(value) is str else one(value) for value in values]


# --- Coalescing rows into groups ---------------------------------------------------

Coalesced = tuple[
    dict[ShardKey, list[Group]], dict[Group, Sequence[Any]], dict[ShardKey, int], set[ShardKey]
]


def coalesce(
    model: type[OutboxBase],
    rows: Sequence[tuple[Any, ...]],
    shards: Sequence[ShardKey] = (),
) -> Coalesced:
    """Group rows read in id order (within each shard) into coalescing groups.

    Each row is the `shard_fields` values, then id, category, object_identifier,
    attempts and whether the row is due, then whatever else the caller read. A shard
    stops at its first row that is not due: that row and the shard's later rows wait
    (the shard is "cut"). Returns the groups per shard (in order of their oldest row),
    each group's newest row, the number of rows read per shard, and the shards cut.
    The loop runs once per row read, so it is kept tight (keys of `shards` are reused).
    """
    width = len(model.shard_fields)
    known = {key[3 - width :]: key for key in shards}
    groups: dict[ShardKey, list[Group]] = {}
    newest: dict[Group, Sequence[Any]] = {}
    read: dict[ShardKey, int] = {}
    cut: set[ShardKey] = set()
    per_shard: dict[tuple[Any, ...], tuple[ShardKey, list[Group], dict[tuple[int, int], Group]]]
    per_shard = {}
    last_raw: tuple[Any, ...] = ()
    shard = ShardKey("", 0, 0)
    shard_groups: list[Group] = []
    by_object: dict[tuple[int, int], Group] = {}
    for row in rows:
        raw = row[:width]  # rows are tuples (as the drivers and values_list give them)
        if raw != last_raw:  # rows of one shard usually come together
            last_raw = raw
            if raw not in per_shard:
                key = known.get(raw) or model.shard_key_of(raw)
                per_shard[raw] = (key, groups.setdefault(key, []), {})
                read[key] = 0
            shard, shard_groups, by_object = per_shard[raw]
        read[shard] += 1
        if not row[width + 4] or shard in cut:
            cut.add(shard)
            continue
        object_key = (row[width + 1], row[width + 2])
        group = by_object.get(object_key)
        if group is None:
            group = Group(shard, object_key[0], object_key[1], row[width], row[width + 3])
            by_object[object_key] = group
            shard_groups.append(group)
        else:
            group.row_ids.append(row[width])
            group.attempts.append(row[width + 3])
        newest[group] = row  # the last row seen of a group is its newest
    return groups, newest, read, cut
