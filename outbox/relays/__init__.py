"""Relays: receivers you declare, not write, that forward delivered messages to the rest
of the system (webhooks, RabbitMQ through kombu, Redis Streams, Kafka, Celery tasks)::

    from outbox.relays import WebhookRelay

    WebhookRelay("billing-hook", url="https://billing.example/hooks", secret=...).connect(
        Category.ORGANIZATION_UPDATE
    )

Each relay's client library is an optional extra (``django-outboxes[webhooks]``,
``[amqp]``, ``[redis]``, ``[kafka]``, ``[celery]``); a relay module is imported only when
its name is first used, so a project installs only the client it uses.
"""

from __future__ import annotations

import importlib
from typing import Any

from outbox.relays.base import Message, Relay, batch_receiver, relays, skip_after_failure
from outbox.relays.envelope import Bare, CloudEvents, Envelope

# The relays, by class name: the module each lives in.
_RELAYS = {
    "WebhookRelay": "outbox.relays.webhooks",
    "AmqpRelay": "outbox.relays.amqp",
    "RedisStreamRelay": "outbox.relays.redis_streams",
    "KafkaRelay": "outbox.relays.kafka",
    "CeleryTaskRelay": "outbox.relays.celery_tasks",
}

__all__ = [
    "Bare",
    "CloudEvents",
    "Envelope",
    "Message",
    "Relay",
    "batch_receiver",
    "relays",
    "skip_after_failure",
    *_RELAYS,
]


def __getattr__(name: str) -> Any:
    module = _RELAYS.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox.relays' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
