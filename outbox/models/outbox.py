"""Outbox tables: the abstract base and the two stock tables.

Rows hand their saves to `OutboxBase.write_path`. By default that is a plain
`Model.save` / `bulk_create`; when the app is ready the write path (`outbox.writes`)
installs its own, which records the shards written for the flush after commit and may
hold rows until the commit (opt-in). This module never imports the write path or the
engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from django.apps import apps
from django.db import models, router, transaction
from django.db.models.functions import Now
from django.dispatch import Signal

from outbox.categories import registry
from outbox.columns import RandomUUID, new_message_id
from outbox.exceptions import InvalidOutboxMessage
from outbox.models.lease import ShardLease, any_shard
from outbox.models.validation import validate_message
from outbox.models.write_path import WritePath
from outbox.shards import ShardKey
from outbox.signals import process_control_outbox, process_region_outbox
from outbox.tracing import with_trace_context

if TYPE_CHECKING:
    from typing_extensions import Self

_Row = TypeVar("_Row", bound="OutboxBase")


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
        return self.model.write_path.bulk_create(
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
    # Replaced by the write path when the app is ready (see WritePath).
    write_path: ClassVar[WritePath] = WritePath()

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
        return validate_message(self)

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
