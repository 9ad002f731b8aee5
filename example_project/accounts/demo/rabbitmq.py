"""The demo's organization changes published to RabbitMQ by a relay, and read back.

When RabbitMQ answers at ``AMQP_URL`` (and kombu is installed: the ``amqp`` extra), the
demo connects an `AmqpRelay` to ``ORGANIZATION_UPDATE`` before it writes its traffic, so
every organization change is published (after the commit, or by the drain) to a topic
exchange, and a queue bound to it collects them. At the end the queue is read back:
every message carries its message id, each organization's changes arrive in the order
they were written, and the last one is the state the mirror holds. The exchange and the
queue are named after ``DEMO_AMQP_EXCHANGE`` (default ``accounts-demo``), so demos on a
shared broker can keep apart; an empty ``AMQP_URL`` publishes nothing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from accounts.models import OrganizationMirror
from accounts.outboxes import Category

ROUTING_KEY = "organization_update"  # the relay's default: the category's name
START_IT = (
    "start it with `sudo apt-get install rabbitmq-server` or "
    "`docker run -d -p 5672:5672 rabbitmq:3`, or set AMQP_URL"
)


@dataclass
class Publishing:
    """The relay and the queue that collects what it publishes."""

    url: str
    exchange: str
    relay: Any = None
    skipped: str = ""  # why nothing is published, when it is not
    bodies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def queue(self) -> str:
        """The queue bound to the exchange, which collects what the relay publishes."""
        return f"{self.exchange}.organization-changes"


def start() -> Publishing:
    """Connect the relay when RabbitMQ answers; else say why not and how to start it."""
    url = settings.AMQP_URL
    publishing = Publishing(url, settings.DEMO_AMQP_EXCHANGE)
    if not url:
        publishing.skipped = "AMQP_URL is empty"
        return publishing
    try:
        import kombu
    except ImportError:
        publishing.skipped = 'kombu is not installed: pip install "django-outboxes[amqp]"'
        return publishing
    try:
        with kombu.Connection(url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
            _fresh_queue(kombu, connection, publishing)
    except Exception as error:  # refused, unknown host, bad credentials
        shown = kombu.Connection(url).as_uri()  # the password masked
        publishing.skipped = f"not reachable at {shown} ({error}): {START_IT}"
        return publishing
    from outbox.relays import AmqpRelay

    publishing.relay = AmqpRelay(
        "demo-organization-changes",
        url=url,
        exchange=publishing.exchange,
        routing_key="{category}",
    ).connect(Category.ORGANIZATION_UPDATE)
    return publishing


def _fresh_queue(kombu: Any, connection: Any, publishing: Publishing) -> None:
    exchange = kombu.Exchange(publishing.exchange, type="topic", durable=True)
    queue = kombu.Queue(publishing.queue, exchange, routing_key=ROUTING_KEY, durable=True)
    queue(connection.default_channel).declare()
    queue(connection.default_channel).purge()


def finish(publishing: Publishing) -> tuple[str, list[str]]:
    """Disconnect the relay, read the queue and check it: the summary line, the problems."""
    if publishing.relay is None:
        return f"rabbitmq   skipped: {publishing.skipped}", []
    publishing.relay.disconnect()
    import kombu

    with kombu.Connection(publishing.url, connect_timeout=2) as connection:
        queue = kombu.Queue(publishing.queue)(connection.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            publishing.bodies.append(json.loads(message.body))
    problems = check(publishing.bodies)
    line = (
        f"rabbitmq   {len(publishing.bodies)} organization changes published to exchange "
        f"{publishing.exchange!r} and read back from queue {publishing.queue!r}"
    )
    return line, problems


def check(events: list[dict[str, Any]]) -> list[str]:
    """Every event once, each organization's in order, the last one the mirror's state."""
    problems = []
    ids = [event["id"] for event in events]
    if len(set(ids)) != len(ids):
        problems.append(f"rabbitmq: {len(ids) - len(set(ids))} messages published twice")
    by_org: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_org[int(event["subject"])].append(event)
    mirrors = {mirror.id: mirror for mirror in OrganizationMirror.objects.all()}
    for org_id, changes in by_org.items():
        times = [event["time"] for event in changes]
        if times != sorted(times):
            problems.append(f"rabbitmq: organization {org_id}'s changes arrived out of order")
        if not _same(changes[-1]["data"], mirrors.get(org_id)):
            problems.append(f"rabbitmq: organization {org_id}'s last change is not its state")
    missing = set(mirrors) - set(by_org)
    if missing:
        problems.append(f"rabbitmq: no change published for organizations {sorted(missing)}")
    return problems


def _same(data: dict[str, Any] | None, mirror: OrganizationMirror | None) -> bool:
    if data is None or mirror is None:
        return data is None and mirror is None
    return all(getattr(mirror, name) == value for name, value in data.items())
