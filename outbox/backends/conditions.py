"""Query conditions shared by the ORM paths (the portable backend, waking back-offs)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import reduce

from django.db.models import Exists, OuterRef, Q

from outbox.models import OutboxBase, OutboxPause
from outbox.shards import ShardKey


def any_of(conditions: Sequence[Q]) -> Q:
    """OR of the conditions; matches nothing when there are none."""
    return reduce(operator.or_, conditions) if conditions else Q(pk__in=[])


def lease_key(key: ShardKey) -> Q:
    """The lease row of one shard, as a condition (for OR-ing and `When`)."""
    return Q(
        region_name=key.region_name,
        shard_scope=key.shard_scope,
        shard_identifier=key.shard_identifier,
    )


def paused(using: str, model: type[OutboxBase]) -> Q:
    """A pause (`outbox.models.pause`) covers the outer outbox row: its scope's, its
    shard's or its category's (NULL columns of a pause match any value). The first
    EXISTS names no row, so the database runs it once per statement, and rows are
    probed one by one only while this table has a pause at all (as the fast paths do)."""
    of_table = OutboxPause.objects.using(using).of(model)
    pauses = of_table.filter(
        Q(shard_identifier__isnull=True) | Q(shard_identifier=OuterRef("shard_identifier")),
        Q(category__isnull=True) | Q(category=OuterRef("category")),
        shard_scope=OuterRef("shard_scope"),
    )
    if "region_name" in model.shard_fields:
        pauses = pauses.filter(Q(region_name__isnull=True) | Q(region_name=OuterRef("region_name")))
    return Q(Exists(of_table)) & Q(Exists(pauses))
