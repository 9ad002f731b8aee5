"""Outbox tables: the abstract base, the two stock tables, and the shard lease table.

Importing this module never imports the engine: rows only tell the write path
(`outbox.context`) which shards they touched, and the engine reads the tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from django.apps import apps
from django.db import models, router
from django.db.models.functions import Now
from django.dispatch import Signal

from outbox import context, insert
from outbox.exceptions import InvalidOutboxMessage
from outbox.shards import ShardKey
from outbox.signals import process_control_outbox, process_region_outbox
from outbox.validation import validate_message

_Row = TypeVar("_Row", bound="OutboxBase")


class OutboxQuerySet(models.QuerySet[_Row]):
    def bulk_create(self, objs: Iterable[_Row], *args: Any, **kwargs: Any) -> list[_Row]:
        """Insert many rows in one statement, validating every one of them first."""
        rows = list(objs)
        for row in rows:
            row.validate_message()
        context.require_context()
        if (
            not args
            and not kwargs
            and all(insert.can_insert_directly(row, self.db, {}) for row in rows)
            and context.hold(rows, self.db)
        ):
            return rows  # written at the commit of the enclosing outbox_context
        created = super().bulk_create(rows, *args, **kwargs)
        context.record_writes(self.db, created)
        return created


class OutboxBase(models.Model):
    """One message. Subclass it (concretely) to give a hot scope a table of its own."""

    id = models.BigAutoField(primary_key=True)
    shard_scope = models.IntegerField()
    shard_identifier = models.BigIntegerField()
    category = models.IntegerField()
    object_identifier = models.BigIntegerField()
    payload = models.JSONField(null=True, blank=True)
    # Times come from the database clock, so app servers with skewed clocks agree.
    scheduled_from = models.DateTimeField(db_default=Now())
    scheduled_for = models.DateTimeField(db_default=Now())
    date_added = models.DateTimeField(db_default=Now(), editable=False)
    # Delivery state, written by the engine when a receiver fails.
    attempts = models.PositiveIntegerField(default=0)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    objects = OutboxQuerySet.as_manager()

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
        return f"{type(self).__name__} #{self.pk} shard {self.shard_key} category {self.category}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.validate_message()
        context.require_context()
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        if not args and insert.can_insert_directly(self, using, kwargs):
            if context.hold([self], using):
                return  # written at the commit of the enclosing outbox_context
            insert.insert(self, using)
        else:
            super().save(*args, **kwargs)
        context.record_writes(self._state.db or using, [self])

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
    def shard_key_of(cls, values: Sequence[Any]) -> ShardKey:
        """Build a key from the values of `shard_fields`, in that order."""
        named = dict(zip(cls.shard_fields, values, strict=True))
        return ShardKey(
            named.get("region_name", ""), named["shard_scope"], named["shard_identifier"]
        )

    def validate_message(self) -> None:
        """Raise InvalidOutboxMessage if this row must not be written."""
        validate_message(self)

    @classmethod
    def message_kwargs(cls, message: Any) -> dict[str, Any]:
        """The keyword arguments of the process signal for a row (or a row-like message
        read by the engine, carrying the shard fields, `object_identifier`, `payload` and
        the `message_columns`)."""
        return {
            "object_identifier": message.object_identifier,
            "shard_identifier": message.shard_identifier,
            "shard_scope": message.shard_scope,
            "payload": message.payload,
        }

    def signal_kwargs(self) -> dict[str, Any]:
        return type(self).message_kwargs(self)


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

    def validate_message(self) -> None:
        if not isinstance(self.region_name, str) or not self.region_name.strip():
            raise InvalidOutboxMessage("ControlOutbox needs a non-empty region_name.")
        if len(self.region_name) > 48:
            raise InvalidOutboxMessage(f"region_name {self.region_name!r} is over 48 characters.")
        super().validate_message()

    @classmethod
    def message_kwargs(cls, message: Any) -> dict[str, Any]:
        return {
            **super().message_kwargs(message),
            "region_name": message.region_name,
            "date_added": message.date_added,
            "scheduled_for": message.scheduled_for,
        }


class ShardLeaseQuerySet(models.QuerySet["ShardLease"]):
    """The lease states, named once; every reader (engine, admin, status, dispatch) uses
    these. Expiry is judged on the database clock (`Now()`), never the app server's.

    - held: a worker holds the shard (token set) and the lease has not expired;
    - backing_off: no holder, the shard waits out a failure's back-off;
    - expired: the lease or back-off is over, so the shard may be claimed again;
    - live: held or backing off (the shard may not be claimed now).
    """

    def of(self, model: type[OutboxBase]) -> ShardLeaseQuerySet:
        """The leases of one outbox table."""
        return self.filter(outbox=model._meta.label_lower)

    def with_token(self, token: str) -> ShardLeaseQuerySet:
        """The leases taken with one claim's token (expired or not)."""
        return self.filter(token=token)

    def live(self) -> ShardLeaseQuerySet:
        return self.filter(expires_at__gt=Now())

    def held(self) -> ShardLeaseQuerySet:
        return self.live().filter(token__isnull=False)

    def backing_off(self) -> ShardLeaseQuerySet:
        return self.live().filter(token__isnull=True)

    def expired(self) -> ShardLeaseQuerySet:
        return self.filter(expires_at__lte=Now())

    def of_shard(self, key: ShardKey) -> ShardLeaseQuerySet:
        return self.filter(
            region_name=key.region_name,
            shard_scope=key.shard_scope,
            shard_identifier=key.shard_identifier,
        )


class ShardLease(models.Model):
    """The lease of one shard of one outbox table: who drains it, and until when.

    A row exists while a worker holds the shard (`token` set) or while the shard backs
    off after a failure (`token` empty, `expires_at` = when it may be retried). The
    shard may be claimed once `expires_at` has passed on the database clock.
    """

    outbox = models.CharField(max_length=100, help_text="Label of the outbox model.")
    region_name = models.CharField(max_length=48, blank=True, default="")
    shard_scope = models.IntegerField()
    shard_identifier = models.BigIntegerField()
    # NULL, not "": a backing-off shard has no holder, and "" could pass for a token.
    token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    expires_at = models.DateTimeField()
    holder = models.CharField(max_length=128, blank=True, default="")
    claimed_at = models.DateTimeField(db_default=Now())

    objects = ShardLeaseQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["outbox", "region_name", "shard_scope", "shard_identifier"],
                name="outbox_shardlease_shard",
            )
        ]
        indexes = [models.Index(fields=["token"], name="outbox_shardlease_token")]

    def __str__(self) -> str:
        key = ShardKey(self.region_name, self.shard_scope, self.shard_identifier)
        state = f"held by {self.holder}" if self.token else "backing off"
        return f"{self.outbox} shard {key} {state} until {self.expires_at}"


def outbox_models() -> list[type[OutboxBase]]:
    """Every installed concrete outbox table."""
    return [
        model
        for model in apps.get_models()
        if issubclass(model, OutboxBase) and not model._meta.proxy
    ]
