"""Paused parts of an outbox table: a scope, a shard or a category that no drain and no
synchronous flush claims until an operator resumes it.

A pause is a row of `OutboxPause`; resuming deletes it. The backends read this small
table inside their claim and read statements (no extra round trip): a row a pause covers
counts as not due, exactly like a row scheduled for later. So a paused shard (or every
shard of a paused scope) keeps its rows and their order and is not claimed; a category
pause holds each shard at its first row of that category, delivering the rows before it
and keeping that row and everything after it (of any category) in order, since a shard
is delivered in order or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from outbox.categories import registry
from outbox.shards import ShardKey


@dataclass(frozen=True)
class PausedPart:
    """What a pause names: a scope, and within it a shard (identifier, and region on a
    table with regions: None, the identifier in every region) or a category, or neither
    (the whole scope)."""

    shard_scope: int
    shard_identifier: int | None = None
    region_name: str | None = None
    category: int | None = None

    @classmethod
    def of_shard(cls, key: ShardKey) -> PausedPart:
        return cls(key.shard_scope, key.shard_identifier, key.region_name or None)

    @classmethod
    def of_category(cls, category: int) -> PausedPart:
        return cls(int(registry.scope_of(registry.category(category))), category=category)

    @property
    def kind(self) -> str:
        if self.category is not None:
            return "category"
        return "shard" if self.shard_identifier is not None else "scope"

    def __str__(self) -> str:
        """`scope ORGANIZATION`, `category ORGANIZATION_UPDATE`, `shard eu/ORGANIZATION/3`."""
        if self.category is not None:
            return f"category {registry.category_name(self.category)}"
        if self.shard_identifier is None:
            return f"scope {registry.scope_name(self.shard_scope)}"
        key = ShardKey(self.region_name or "", self.shard_scope, self.shard_identifier)
        return f"shard {registry.shard_name(key)}"

    def lookups(self) -> dict[str, Any]:
        return {
            "shard_scope": self.shard_scope,
            "shard_identifier": self.shard_identifier,
            "region_name": self.region_name,
            "category": self.category,
        }


class OutboxPauseQuerySet(models.QuerySet[Any]):
    def of(self, model: type[models.Model]) -> OutboxPauseQuerySet:
        """The pauses of one outbox table."""
        return cast(OutboxPauseQuerySet, self.filter(outbox=model._meta.label_lower))

    def of_part(self, part: PausedPart) -> OutboxPauseQuerySet:
        """The pauses naming exactly `part` (normally one)."""
        return cast(OutboxPauseQuerySet, self.filter(**part.lookups()))

    def covering_rows(self, model: type[models.Model]) -> Q:
        """A condition on the outer rows of the outbox table `model`: a pause covers the
        row (its scope's, its shard's or its category's; NULL columns of a pause match
        any value). The first EXISTS names no row, so the database runs it once per
        statement, and rows are probed one by one only while this table has a pause at
        all (as the fast paths do)."""
        of_table = self.of(model)
        pauses = of_table.filter(
            Q(shard_identifier__isnull=True) | Q(shard_identifier=OuterRef("shard_identifier")),
            Q(category__isnull=True) | Q(category=OuterRef("category")),
            shard_scope=OuterRef("shard_scope"),
        )
        if "region_name" in getattr(model, "shard_fields", ()):
            pauses = pauses.filter(
                Q(region_name__isnull=True) | Q(region_name=OuterRef("region_name"))
            )
        return Q(Exists(of_table)) & Q(Exists(pauses))

    def covering_shard(self, key: ShardKey) -> OutboxPauseQuerySet:
        """The pauses that hold shard `key` whole (its scope's or its own; not a
        category's, which holds it only at a row of that category)."""
        region = models.Q(region_name__isnull=True) | models.Q(region_name=key.region_name)
        own = models.Q(shard_identifier=key.shard_identifier) & region
        whole_scope = models.Q(shard_identifier__isnull=True)
        return cast(
            OutboxPauseQuerySet,
            self.filter(whole_scope | own, shard_scope=key.shard_scope, category__isnull=True),
        )


class OutboxPause(models.Model):
    """One paused part of one outbox table (`PausedPart`): NULL columns match any value.
    The backends' claims and reads skip what a pause covers; nothing else changes."""

    outbox = models.CharField(max_length=100, help_text="Label of the outbox model.")
    shard_scope = models.IntegerField()
    shard_identifier = models.BigIntegerField(null=True, blank=True)
    region_name = models.CharField(max_length=48, null=True, blank=True)  # noqa: DJ001
    category = models.IntegerField(null=True, blank=True)
    paused_at = models.DateTimeField(db_default=Now(), editable=False)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.CharField(max_length=255, blank=True, default="")

    objects = OutboxPauseQuerySet.as_manager()

    class Meta:
        # No index: the table holds a few rows (usually none), which a scan reads at
        # once, and the claims plan their probe of it faster without one to weigh.
        verbose_name = "outbox pause"

    def __str__(self) -> str:
        return f"{self.outbox} {self.part} paused"

    @property
    def part(self) -> PausedPart:
        return PausedPart(self.shard_scope, self.shard_identifier, self.region_name, self.category)


def pause(
    model: type[models.Model],
    part: PausedPart,
    *,
    using: str,
    paused_by: str = "",
    reason: str = "",
) -> tuple[OutboxPause, bool]:
    """Pause `part` of `model`'s table; (the pause, whether it is new). Pausing a part
    already paused changes nothing."""
    pauses = OutboxPause.objects.using(using)
    existing = pauses.of(model).of_part(part).first()
    if existing is not None:
        return existing, False
    created = pauses.create(
        outbox=model._meta.label_lower, paused_by=paused_by, reason=reason, **part.lookups()
    )
    return created, True


def resume(model: type[models.Model], part: PausedPart, *, using: str) -> list[OutboxPause]:
    """Resume `part` of `model`'s table: delete its pause; the pauses deleted (none when
    it was not paused). Its shards are claimed again by the next drain, where they
    stopped."""
    pauses = OutboxPause.objects.using(using).of(model).of_part(part)
    found = list(pauses)
    pauses.filter(pk__in=[found_pause.pk for found_pause in found]).delete()
    return found
