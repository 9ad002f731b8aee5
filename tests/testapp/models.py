from django.db import models

from outbox.models import ControlOutbox, RegionOutbox
from outbox.writes.producers import OutboxProducer
from tests.testapp.categories import Category, Scope


class Organization(OutboxProducer):
    name = models.CharField(max_length=100)

    def outboxes_for_update(self):
        return [
            RegionOutbox(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=self.id,
                category=Category.ORGANIZATION_UPDATE,
                object_identifier=self.id,
                payload={"name": self.name},
            )
        ]

    def outboxes_for_delete(self):
        [outbox] = self.outboxes_for_update()
        outbox.payload = None
        return [outbox]


class Account(OutboxProducer):
    """A control-side model whose changes go to one region's ControlOutbox."""

    email = models.CharField(max_length=100)
    region = models.CharField(max_length=48, default="us")

    def outboxes_for_update(self):
        return [
            ControlOutbox(
                region_name=self.region,
                shard_scope=Scope.USER,
                shard_identifier=self.id,
                category=Category.USER_UPDATE,
                object_identifier=self.id,
                payload={"email": self.email},
            )
        ]


class Delivery(models.Model):
    """A journal of receiver calls, written by the receivers (used across threads)."""

    category = models.IntegerField()
    shard_identifier = models.BigIntegerField()
    object_identifier = models.BigIntegerField()
    payload = models.JSONField(null=True)
    thread = models.CharField(max_length=64, default="")
    process = models.IntegerField(default=0)  # the pid, for tests with worker processes
    started = models.FloatField(default=0.0)
    ended = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"shard {self.shard_identifier} object {self.object_identifier}"


class Ledger(models.Model):
    """Written by a transactional receiver: exactly once per delivered message."""

    entry = models.BigIntegerField(unique=True)

    def __str__(self) -> str:
        return f"ledger entry {self.entry}"
