"""A producer model as a project has it when it adopts the outbox: rows already there,
none of them with a message yet. Its receiver counts the calls per object."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db import models

from outbox import OutboxCategory, OutboxScope
from outbox.models import RegionOutbox
from outbox.signals import process_region_outbox
from outbox.writes.producers import OutboxProducer


class Category(OutboxCategory):
    CUSTOMER_UPDATE = 1


class Scope(OutboxScope):
    CUSTOMER = 0, {Category.CUSTOMER_UPDATE}


class Customer(OutboxProducer):
    name = models.CharField(max_length=100)
    plan = models.CharField(max_length=20, default="free")

    def __str__(self) -> str:
        return self.name

    def outboxes_for_update(self) -> list[RegionOutbox]:
        return [
            RegionOutbox(
                shard_scope=Scope.CUSTOMER,
                shard_identifier=self.pk,
                category=Category.CUSTOMER_UPDATE,
                object_identifier=self.pk,
                payload={"name": self.name, "plan": self.plan},
            )
        ]


# Calls per object_identifier, in this process.
delivered: Counter[int] = Counter()


def record(sender: Any, object_identifier: int, **kwargs: Any) -> None:
    delivered[object_identifier] += 1


def connect_receiver() -> None:
    process_region_outbox.connect(record, sender=Category.CUSTOMER_UPDATE, weak=False)
