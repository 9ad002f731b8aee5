"""Query conditions shared by the ORM paths (the portable backend, waking back-offs)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import reduce

from django.db.models import Q

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
