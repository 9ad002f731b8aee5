"""Outbox tables: the abstract base and the two stock tables.

Rows hand their saves to `OutboxBase.write_path`. By default that is a plain
`Model.save` / `bulk_create`; when the app is ready the write path (`outbox.writes`)
installs its own, which records the shards written for the flush after commit and may
hold rows until the commit (opt-in). This module never imports the write path or the
engine.

What a row must pass before it is written (`check_message`, at the end): every check
runs before any SQL, so a refused row leaves the caller's transaction usable on every
database. The rules are the same on every database: a row accepted on SQLite in
development is accepted by PostgreSQL and MariaDB in production.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Func, UUIDField
from django.db.models.functions import Now
from django.dispatch import Signal

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.exceptions import InvalidOutboxMessage
from outbox.headers import allowed_credentials, check_writer_header, control_character
from outbox.models.lease import ShardLease, any_shard
from outbox.models.write_path import WritePath
from outbox.shards import ShardKey
from outbox.signals import process_control_outbox, process_region_outbox
from outbox.tracing import with_trace_context

if TYPE_CHECKING:
    from typing_extensions import Self

_Row = TypeVar("_Row", bound="OutboxBase")


# The defaults of the `message_id` column: how a message id is made in Python, and by the
# database for rows written without one. Migrations name these two by their path in
# `outbox.columns`, which keeps them importable there.
def new_message_id() -> uuid.UUID:
    """A new message id: a version 7 UUID (RFC 9562), the Unix time in milliseconds
    followed by 74 random bits. Ids made later sort later, so logs and brokers that
    order by id see roughly the order of writing; uniqueness comes from the random bits
    (a collision needs two ids in the same millisecond with equal 74 random bits)."""
    random_bits = int.from_bytes(os.urandom(10), "big")
    value = (time.time_ns() // 1_000_000) << 80
    value |= 0x7 << 76 | (random_bits >> 68) << 64  # version 7, 12 random bits
    value |= 0b10 << 62 | (random_bits & _LOW_62)  # RFC 9562 variant, 62 random bits
    return uuid.UUID(int=value)


_LOW_62 = (1 << 62) - 1


class RandomUUID(Func):
    """A random UUID made by the database: the column default of `message_id`, so rows
    that exist when the column is added, and rows inserted by code that does not set
    it (an older release during a rolling deploy), each get an id of their own."""

    template = "gen_random_uuid()"  # PostgreSQL
    output_field = UUIDField()

    def as_mysql(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        # MariaDB's UUID(), in the 32 hex digits that fit a char(32) column as well
        return self.as_sql(compiler, connection, template="REPLACE(UUID(), '-', '')", **extra)

    def as_sqlite(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        # the 32 hex digits Django stores for a UUIDField
        return self.as_sql(compiler, connection, template="lower(hex(randomblob(16)))", **extra)


class OutboxQuerySet(models.QuerySet[_Row]):
    """Selection of outbox rows. The delivery states are named here once: `pending()`
    (rows the drain delivers) and `dead()` (dead letters, kept for an operator)."""

    def pending(self) -> Self:
        return cast("Self", self.filter(dead_at__isnull=True))

    def dead(self) -> Self:
        return cast("Self", self.filter(dead_at__isnull=False))

    def retry_dead(self) -> int:
        """Make the dead rows of this selection pending and due now, attempts reset to 0,
        back in their shard at their place in id order. Returns the rows revived. Their
        `delivered_to` is kept: receivers that succeeded for a row are not called again."""
        # Its history stays: `first_attempt_at`, `last_attempt_at`, `last_error` and
        # `last_traceback` are kept (a failure after the revival keeps the first time,
        # as any failure does); only `attempts`, the count the retry policy limits,
        # starts again. The revival itself is in the admin log where an operator did it.
        return self.dead().update(
            dead_at=None,
            attempts=0,
            scheduled_from=Now(),
            scheduled_for=Now(),
        )

    def discard(self) -> int:
        """Delete the rows of this selection for good; returns how many. So do the leases
        (a back-off, a dead worker's) of their shards left with no pending row and held
        by no live worker: no drain claims such a shard, so none would remove them."""
        # Where `delete()` deletes: the `using()` given, else the router's write database.
        using = self.select_for_update().db
        left = OutboxQuerySet(self.model, using=using).pending().exclude(pk__in=self.values("pk"))
        leases = ShardLease.objects.using(using).not_held().of_shards_of(self)
        with transaction.atomic(using=using):
            # First: the leases are found through the rows.
            leases.of_shards_of(left, having=False).delete()
            deleted, _ = self.delete()
        return deleted

    def bulk_create(self, objs: Iterable[_Row], *args: Any, **kwargs: Any) -> list[_Row]:
        """Insert many rows in one statement, validating every one of them first."""
        rows = list(objs)
        payloads = [row.prepare_to_write() for row in rows]
        path = self.model.write_path
        if path is None:  # before the app is ready
            return models.QuerySet.bulk_create(self, rows, *args, **kwargs)
        return path.bulk_create(
            rows,
            self.db,
            payloads,
            lambda: models.QuerySet.bulk_create(self, rows, *args, **kwargs),
            can_hold=not args and not kwargs and all(row.pk is None for row in rows),
        )


class OutboxBase(models.Model):
    """One message. Subclass it (concretely) to give a hot scope a table of its own."""

    id = models.BigAutoField(primary_key=True)
    shard_scope = models.IntegerField()
    shard_identifier = models.BigIntegerField()
    category = models.IntegerField()
    object_identifier = models.BigIntegerField()
    payload = models.JSONField(null=True, blank=True)
    # The message's identity: stable across retries of the row, unique across tables,
    # databases and regions. Made in Python so a row knows it before it is written; the
    # database default covers rows written without it (and those there before it).
    message_id = models.UUIDField(
        default=new_message_id,
        db_default=RandomUUID(),
        editable=False,
        help_text="The message's id, the same on every delivery attempt of this row: an "
        "idempotency key for receivers.",
    )
    # Small string headers from the writer (a correlation id, a tenant, the W3C trace
    # context), delivered with the payload; NULL for none.
    headers = models.JSONField(null=True, blank=True)
    # Times come from the database clock, so app servers with skewed clocks agree.
    scheduled_from = models.DateTimeField(
        db_default=Now(),
        help_text="When the current schedule was set: the write, or the last failed "
        "attempt. Until scheduled_for, the row waits out this back-off.",
    )
    scheduled_for = models.DateTimeField(
        db_default=Now(), help_text="When the row is due (its shard may then be drained)."
    )
    date_added = models.DateTimeField(db_default=Now(), editable=False)
    # Delivery state, written by the engine when a receiver fails.
    attempts = models.PositiveIntegerField(default=0)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # Written only on failure: the formatted traceback, and (JSON list) the receivers
    # that already succeeded for this row, so a retry of the same row skips them.
    # Database defaults keep INSERTs that name only the older columns valid.
    last_traceback = models.TextField(blank=True, default="", db_default="")
    delivered_to = models.TextField(blank=True, default="", db_default="")
    dead_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the row became a dead letter (attempts exhausted or a permanent "
        "failure); dead rows are never delivered and never block their shard.",
    )

    objects = OutboxQuerySet.as_manager()
    # The write path the app installs when it is ready (see WritePath); until then a
    # row is written at once, as `Model.save` writes it.
    write_path: ClassVar[WritePath | None] = None

    # The columns that name a shard, in index order.
    shard_fields: ClassVar[tuple[str, ...]] = ("shard_scope", "shard_identifier")
    process_signal: ClassVar[Signal] = process_region_outbox
    # Columns besides the shard, category, object and payload that message_kwargs reads.
    message_columns: ClassVar[tuple[str, ...]] = ()

    class Meta:
        abstract = True
        indexes = [
            # The one secondary index, kept to one so that writes stay cheap. It serves
            # shard order (a shard's rows in id order), coalescing (done per shard over
            # that ordered read), the skip scan that finds shards, and the due check
            # within a shard. A due-time index would cost every write and save little:
            # due rows are nearly all rows.
            models.Index(fields=["shard_scope", "shard_identifier", "id"], name="%(class)s_shard"),
        ]

    def __str__(self) -> str:
        """E.g. `RegionOutbox #7 shard ORGANIZATION/1 category AUDIT_EVENT` (numbers for
        values no enum declares): the admin's titles and audit entries show it."""
        key, name = self.shard_key, registry.scope_name(self.shard_scope)
        shard = f"{key.region_name + '/' if key.region_name else ''}{name}/{key.shard_identifier}"
        category = registry.category_name(self.category)
        return f"{type(self).__name__} #{self.pk} shard {shard} category {category}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Validate, then save as `Model.save` does, through the table's write path."""
        payload_json = self.prepare_to_write()
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        kwargs["using"] = using
        if self.write_path is None:  # before the app is ready
            models.Model.save(self, *args, **kwargs)
            return
        self.write_path.save(
            self,
            using,
            payload_json,
            lambda: models.Model.save(self, *args, **kwargs),
            can_hold=(
                not args
                and self.pk is None
                and not kwargs.get("update_fields")
                and not kwargs.get("force_update")
                and not self._meta.parents
            ),
        )

    def retry_dead(self) -> bool:
        """Revive this row if it is a dead letter (see `OutboxQuerySet.retry_dead`)."""
        revived = type(self).objects.filter(pk=self.pk).retry_dead()
        self.refresh_from_db()
        return bool(revived)

    def discard(self) -> None:
        """Delete this row for good (an operator's decision, for a dead letter), with its
        shard's lease where nothing else is left there (see `OutboxQuerySet.discard`)."""
        using = router.db_for_write(type(self), instance=self)  # where Model.delete() goes
        type(self)._default_manager.using(using).filter(pk=self.pk).discard()

    @property
    def shard_key(self) -> ShardKey:
        return ShardKey(
            getattr(self, "region_name", ""), int(self.shard_scope), int(self.shard_identifier)
        )

    @classmethod
    def shard_lookup(cls, key: ShardKey) -> dict[str, Any]:
        """Field lookups selecting one shard's rows."""
        return {field: getattr(key, field) for field in cls.shard_fields}

    @classmethod
    def of_shards(cls, keys: Iterable[ShardKey]) -> models.Q:
        """The rows of any of the shards `keys`, as a condition (none when there are none)."""
        return any_shard(keys, cls.shard_fields)

    @classmethod
    def shard_key_of(cls, values: Sequence[Any]) -> ShardKey:
        """Build a key from the values of `shard_fields`, in that order."""
        named = dict(zip(cls.shard_fields, values, strict=True))
        return ShardKey(
            named.get("region_name", ""), named["shard_scope"], named["shard_identifier"]
        )

    def validate_message(self) -> str:
        """Raise InvalidOutboxMessage if this row must not be written; else return the
        payload as the JSON text the field's encoder makes of it."""
        return check_message(self)

    def prepare_to_write(self) -> str:
        """Stamp the current span's trace context into the headers (see
        `outbox.tracing`), then validate the row; returns the payload's JSON text."""
        self.headers = with_trace_context(self.headers)
        return self.validate_message()

    @classmethod
    def message_kwargs(cls, message: Any) -> dict[str, Any]:
        """The keyword arguments of the process signal for a row (or a row-like message
        read by the engine, carrying the shard fields, `object_identifier`, `payload`,
        `message_id`, `attempts`, `headers` and the `message_columns`). `attempt` counts
        this delivery: 1 for the first, one more after each failed attempt."""
        return {
            "object_identifier": message.object_identifier,
            "shard_identifier": message.shard_identifier,
            "shard_scope": message.shard_scope,
            "payload": message.payload,
            "message_id": message.message_id,
            "attempt": message.attempts + 1,
            "headers": message.headers or {},
        }


class RegionOutbox(OutboxBase):
    """Messages produced in a region, handled by `process_region_outbox` receivers."""

    class Meta(OutboxBase.Meta):
        verbose_name = "region outbox message"


class ControlOutbox(OutboxBase):
    """Messages for one region, handled by `process_control_outbox` receivers.

    `region_name` leads the shard and coalescing keys: shards never span regions.
    """

    region_name = models.CharField(max_length=48)

    shard_fields = ("region_name", "shard_scope", "shard_identifier")
    process_signal = process_control_outbox
    message_columns = ("date_added", "scheduled_for")

    class Meta(OutboxBase.Meta):
        verbose_name = "control outbox message"
        indexes = [
            models.Index(
                fields=["region_name", "shard_scope", "shard_identifier", "id"],
                name="%(class)s_shard",
            ),
        ]

    def validate_message(self) -> str:
        if not isinstance(self.region_name, str) or not self.region_name.strip():
            raise InvalidOutboxMessage("ControlOutbox needs a non-empty region_name.")
        if len(self.region_name) > 48:
            raise InvalidOutboxMessage(f"region_name {self.region_name!r} is over 48 characters.")
        return super().validate_message()

    @classmethod
    def message_kwargs(cls, message: Any) -> dict[str, Any]:
        return {
            **super().message_kwargs(message),
            "region_name": message.region_name,
            "date_added": message.date_added,
            "scheduled_for": message.scheduled_for,
        }


def outbox_models() -> list[type[OutboxBase]]:
    """Every installed concrete outbox table."""
    return [
        model
        for model in apps.get_models()
        if issubclass(model, OutboxBase) and not model._meta.proxy
    ]


# --- What a row must pass before it is written ---------------------------------------

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


def check_message(row: OutboxBase) -> str:
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
    model: type[OutboxBase],
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


def _check_integer(row: OutboxBase, field: str, low: int, high: int) -> None:
    value = getattr(row, field)
    if value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidOutboxMessage(f"{field} must be an integer, got {value!r}.")
    if not low <= value <= high:
        raise InvalidOutboxMessage(
            f"{field}={value} does not fit its column, which holds {low} to {high}."
        )


def _check_text(row: OutboxBase, field: str) -> None:
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


def _category(row: OutboxBase) -> str:
    """The row's category as errors name it: by its declared name (read only when a row
    is refused, so a row that passes pays nothing for it)."""
    return registry.category_name(row.category)


def _check_payload(row: OutboxBase) -> str:
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
def _payload_encoder(model: type[OutboxBase]) -> Callable[[Any], str]:
    """How the payload becomes JSON text, as json.dumps would make it with the payload
    field's own encoder class (as Django uses it). allow_nan=False: NaN and infinity are
    not JSON, and PostgreSQL would reject them mid-transaction, leaving the caller's
    transaction broken. The standard encoders keep no state between calls, so one
    instance serves every call; an encoder of the project's own is made for each."""
    encoder = getattr(model._meta.get_field("payload"), "encoder", None) or json.JSONEncoder
    if encoder in (json.JSONEncoder, DjangoJSONEncoder):
        return encoder(allow_nan=False).encode
    return lambda payload: encoder(allow_nan=False).encode(payload)


def _encoder_hint(model: type[OutboxBase], exc: Exception) -> str:
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
