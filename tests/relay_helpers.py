"""What the relays' tests share: rows written for several shards, the back-off skipped,
and messages made for a relay's `publish` directly."""

import uuid

from django.db import transaction
from django.db.models.functions import Now

from outbox import outbox_context
from outbox.models import RegionOutbox, ShardLease
from outbox.relays import Message
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category, Scope

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def write(shards, per_shard, *, flush=False):
    """`per_shard` AUDIT_EVENT rows in each of shards 1..`shards`, interleaved."""
    with outbox_context(transaction.atomic(), flush=flush):
        return [
            RegionOutboxFactory(
                shard_identifier=shard,
                payload={"shard": shard, "n": n},
                headers={"traceparent": TRACEPARENT},
            )
            for n in range(per_shard)
            for shard in range(1, shards + 1)
        ]


def make_due():
    """Skip the back-off: every shard and row due now."""
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.pending().update(scheduled_for=Now())


def message(shard=1, **fields):
    """One AUDIT_EVENT message of `shard` (object `shard`), with `fields` as given."""
    values = {
        "message_id": uuid.uuid4(),
        "category": Category.AUDIT_EVENT,
        "scope": Scope.ORGANIZATION,
        "shard_identifier": shard,
        "object_identifier": shard,
        "payload": {"shard": shard},
        **fields,
    }
    return Message(**values)


def messages(shards, per_shard, first_shard=1, payload=None):
    """Messages of `per_shard` AUDIT_EVENTs in each of `shards` shards, interleaved (as
    a batched engine hands them over); `payload(shard, n)` makes each payload."""
    return [
        Message(
            message_id=uuid.uuid4(),
            category=Category.AUDIT_EVENT,
            scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            object_identifier=n,
            payload=payload(shard, n) if payload else {"shard": shard, "n": n},
        )
        for n in range(per_shard)
        for shard in range(first_shard, first_shard + shards)
    ]
