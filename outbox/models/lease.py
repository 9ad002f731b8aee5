"""The shard lease table and the lease states, named once on its QuerySet."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any, cast

from django.db import models
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now

from outbox.shards import ShardKey

if TYPE_CHECKING:
    from typing_extensions import Self

_KEY_FIELDS = ("region_name", "shard_scope", "shard_identifier")


def any_shard(keys: Iterable[ShardKey], fields: Sequence[str] = _KEY_FIELDS) -> Q:
    """The rows of any of the shards `keys`, as a condition on the columns `fields` (a
    lease row's whole key, or an outbox table's `shard_fields`); matches nothing when
    there are none."""
    conditions = [Q(**{name: getattr(key, name) for name in fields}) for key in keys]
    return reduce(operator.or_, conditions) if conditions else Q(pk__in=[])


class ShardLeaseQuerySet(models.QuerySet[Any]):
    """The lease states, named once; every reader (engine, admin, status, dispatch) uses
    these. Expiry is judged on the database clock (`Now()`), never the app server's.

    - held: a worker holds the shard (token set) and the lease has not expired;
    - backing_off: no holder, the shard waits out a failure's back-off;
    - expired: the lease or back-off is over, so the shard may be claimed again; it is
      one of the two states below, told apart by the token, which only a worker's
      claim sets (a failure's back-off clears it);
    - abandoned: a worker's lease (token set) ran out: the worker died or stopped
      renewing. This one is stuck, and what monitoring calls "expired";
    - retry_due: a back-off (no token) is over: a routine retry waiting for a drain;
    - live: held or backing off (the shard may not be claimed now);
    - not_held: backing off or expired (no live worker holds the shard).
    """

    def _where(self, **lookups: Any) -> Self:
        return cast("Self", self.filter(**lookups))

    def of(self, model: type[models.Model]) -> Self:
        """The leases of one outbox table."""
        return self._where(outbox=model._meta.label_lower)

    def with_token(self, token: str) -> Self:
        """The leases taken with one claim's token (expired or not)."""
        return self._where(token=token)

    def live(self) -> Self:
        return self._where(expires_at__gt=Now())

    def held(self) -> Self:
        return self._where(expires_at__gt=Now(), token__isnull=False)

    def backing_off(self) -> Self:
        return self._where(expires_at__gt=Now(), token__isnull=True)

    def expired(self) -> Self:
        return self._where(expires_at__lte=Now())

    def abandoned(self) -> Self:
        return self._where(expires_at__lte=Now(), token__isnull=False)

    def retry_due(self) -> Self:
        return self._where(expires_at__lte=Now(), token__isnull=True)

    def not_held(self) -> Self:
        return cast("Self", self.filter(Q(token__isnull=True) | Q(expires_at__lte=Now())))

    def of_shards_of(self, rows: QuerySet[Any], *, having: bool = True) -> Self:
        """The leases of the table of `rows` whose shard has a row in `rows`
        (`having=False`: has none)."""
        model = rows.model
        same_shard = {field: OuterRef(field) for field in model.shard_fields}
        found = Exists(rows.filter(**same_shard))
        return cast("Self", self.of(model).filter(found if having else ~found))

    def of_shard(self, key: ShardKey) -> Self:
        return self.of_shards([key])

    def of_shards(self, keys: Iterable[ShardKey]) -> Self:
        """The leases of any of the shards `keys` (none when there are none)."""
        return cast("Self", self.filter(any_shard(keys)))


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
