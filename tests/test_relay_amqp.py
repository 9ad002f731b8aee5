"""AmqpRelay against the real RabbitMQ: rows written in outbox_context and delivered by
the real engine are consumed back (kombu, a queue bound to an exchange of the test's
own) in order per shard, persistent, under the rows' message ids, with the relay's
headers and the CloudEvents attributes; a message the broker does not confirm (a nack,
a return, a missing exchange) is a failure that holds only its shard; and a broker cut
mid-drain loses nothing."""

import json
import secrets
import sys
import threading
import time
from collections import defaultdict

import kombu
import pytest
from django.core.checks import run_checks

from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.models import RegionOutbox
from outbox.relays import AmqpRelay
from tests.conftest import committing
from tests.relay_helpers import TRACEPARENT, make_due, messages, write
from tests.tcp_proxy import TcpProxy
from tests.testapp.categories import Category

pytestmark = committing

BROKER_PORT = 5672
BROKER_URL = f"amqp://guest:guest@127.0.0.1:{BROKER_PORT}//"


class Broker:
    """The test's own exchange (topic, durable: as the relay declares it) and queues
    bound to it; all deleted after the test."""

    def __init__(self) -> None:
        self.name = f"outbox-test-{secrets.token_hex(6)}"
        self.connection = kombu.Connection(BROKER_URL)
        self.exchange = kombu.Exchange(self.name, "topic", durable=True)
        self.queues: list[kombu.Queue] = []

    def queue(self, binding="#", **arguments) -> str:
        name = f"{self.name}-{len(self.queues)}"
        # x-expires: a queue left by a test that died goes away by itself.
        queue = kombu.Queue(
            name,
            self.exchange,
            routing_key=binding,
            queue_arguments={"x-expires": 600_000, **arguments},
        )
        queue(self.connection.default_channel).declare()
        self.queues.append(queue)
        return name

    def consume(self, name, count, timeout=5.0):
        """The queue's messages: wait up to `timeout` for `count` distinct message ids,
        then take whatever else is there (repeats among them)."""
        queue = kombu.Queue(name, no_declare=True)(self.connection.default_channel)
        got = []
        deadline = time.monotonic() + timeout
        while True:
            message = queue.get(no_ack=True)
            if message is not None:
                got.append(message)
                continue
            distinct = len({m.properties["message_id"] for m in got})
            if distinct >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.02)

    def close(self) -> None:
        channel = self.connection.default_channel
        for queue in self.queues:
            queue(channel).delete()
        self.exchange(channel).delete()
        self.connection.release()


@pytest.fixture
def broker():
    broker = Broker()
    broker.exchange(broker.connection.default_channel).declare()
    yield broker
    broker.close()


@pytest.fixture
def make_relay(broker):
    """An AmqpRelay on the test's exchange, connected to AUDIT_EVENT; disconnected after
    the test."""
    made = []

    def make(port=BROKER_PORT, **options):
        options.setdefault("exchange", broker.name)
        relay = AmqpRelay(
            f"{broker.name}-{len(made)}",
            url=f"amqp://guest:guest@127.0.0.1:{port}//",
            **options,
        )
        made.append(relay)
        return relay.connect(Category.AUDIT_EVENT)

    yield make
    for relay in made:
        relay.disconnect()


def payload(message):
    body = json.loads(message.body)
    if message.content_type == "application/cloudevents+json":
        return body["data"]
    return body


def sequences(consumed):
    """Per shard, the payloads' `n` in the order consumed, repeats dropped."""
    by_shard = defaultdict(list)
    for message in consumed:
        n = payload(message)["n"]
        if n not in by_shard[message.headers["outbox-shard"]]:
            by_shard[message.headers["outbox-shard"]].append(n)
    return dict(by_shard)


def test_drained_messages_are_consumed_in_shard_order_persistent_under_their_ids(
    make_relay, broker
):
    queue = broker.queue()
    make_relay()
    rows = write(shards=3, per_shard=4)
    assert drain_outboxes([RegionOutbox]).failures == 0
    assert not RegionOutbox.objects.exists()
    consumed = broker.consume(queue, len(rows))
    assert sorted(m.properties["message_id"] for m in consumed) == sorted(
        str(row.message_id) for row in rows
    )
    assert sequences(consumed) == {f"ORGANIZATION:{shard}": [0, 1, 2, 3] for shard in (1, 2, 3)}
    for message in consumed:
        (row,) = [r for r in rows if str(r.message_id) == message.properties["message_id"]]
        assert message.properties["delivery_mode"] == 2
        assert message.delivery_info["routing_key"] == "audit_event"
        assert message.content_type == "application/cloudevents+json"
        assert message.content_encoding == "utf-8"
        assert message.headers == {
            "outbox-message-id": str(row.message_id),
            "outbox-category": "AUDIT_EVENT",
            "outbox-shard": f"ORGANIZATION:{row.shard_identifier}",
            "outbox-attempt": "1",
            "traceparent": TRACEPARENT,
        }
        event = json.loads(message.body)
        assert event["id"] == str(row.message_id)
        assert event["specversion"] == "1.0"
        assert event["type"] == "audit_event"
        assert event["source"] == "/outbox/organization"
        assert event["subject"] == str(row.object_identifier)
        assert event["traceparent"] == TRACEPARENT
        assert event["data"] == row.payload


def test_binary_cloudevents_travel_as_cloudEvents_headers_beside_the_bare_payload(
    make_relay, broker
):
    queue = broker.queue()
    make_relay(envelope="cloudevents-binary")
    (row,) = write(shards=1, per_shard=1)
    drain_outboxes([RegionOutbox])
    (message,) = broker.consume(queue, 1)
    assert json.loads(message.body) == row.payload
    assert message.content_type == "application/json"
    headers = message.headers
    assert headers["cloudEvents:id"] == headers["outbox-message-id"] == str(row.message_id)
    assert headers["cloudEvents:specversion"] == "1.0"
    assert headers["cloudEvents:type"] == "audit_event"
    assert headers["cloudEvents:source"] == "/outbox/organization"
    assert headers["cloudEvents:subject"] == str(row.object_identifier)
    assert headers["cloudEvents:traceparent"] == TRACEPARENT
    assert "cloudEvents:datacontenttype" not in headers


def test_a_flush_publishes_right_after_commit_with_the_templated_routing_key(make_relay, broker):
    queue = broker.queue("organization.*.2")
    make_relay(routing_key="{scope}.{category}.{shard_identifier}", envelope="bare")
    rows = write(shards=3, per_shard=1, flush=True)
    assert not RegionOutbox.objects.exists()
    (message,) = broker.consume(queue, 2, timeout=1.0)
    assert message.delivery_info["routing_key"] == "organization.audit_event.2"
    assert message.properties["message_id"] == str(rows[1].message_id)


def test_a_missing_exchange_fails_the_shard_until_it_exists(make_relay, broker):
    make_relay(exchange=f"{broker.name}-later", declare=False)
    write(shards=1, per_shard=2)
    assert drain_outboxes([RegionOutbox]).failures == 1
    assert RegionOutbox.objects.count() == 2
    assert "NOT_FOUND" in RegionOutbox.objects.get(attempts=1).last_error

    later = kombu.Exchange(f"{broker.name}-later", "topic", durable=True)
    queue = kombu.Queue(f"{broker.name}-later", later, routing_key="#", auto_delete=True)
    channel = broker.connection.default_channel
    later(channel).declare()
    queue(channel).declare()
    try:
        make_due()
        drain_outboxes([RegionOutbox])
        assert not RegionOutbox.objects.exists()
        assert [payload(m)["n"] for m in broker.consume(queue.name, 2)] == [0, 1]
    finally:
        queue(channel).delete()
        later(channel).delete()


def test_with_mandatory_a_message_no_queue_takes_is_a_failure_not_a_loss(make_relay, broker):
    broker.queue("elsewhere")
    make_relay(mandatory=True)
    write(shards=1, per_shard=1)
    assert drain_outboxes([RegionOutbox]).failures == 1
    assert "NO_ROUTE" in RegionOutbox.objects.get().last_error


def test_a_routing_key_amqp_cannot_carry_is_a_dead_letter_at_once(make_relay, broker):
    queue = broker.queue()
    make_relay(routing_key=lambda m: "k" * 256 if m.shard_identifier == 2 else "events")
    write(shards=2, per_shard=1)
    stats = drain_outboxes([RegionOutbox])
    assert stats.dead_lettered == 1
    dead = RegionOutbox.objects.get()
    assert dead.shard_identifier == 2 and dead.dead_at is not None
    assert "longer than AMQP's 255 bytes" in dead.last_error
    assert [payload(m)["shard"] for m in broker.consume(queue, 1)] == [1]


def test_a_batch_stops_a_shard_at_its_first_return_and_publishes_the_others(make_relay, broker):
    """Shard 2's second message is routed nowhere and returned (mandatory): its later
    messages are not published and fail with the same error."""
    queue = broker.queue("events")

    def routing_key(message):
        return (
            "nowhere"
            if (message.shard_identifier, message.object_identifier) == (2, 1)
            else "events"
        )

    relay = make_relay(routing_key=routing_key, mandatory=True)
    batch = messages(shards=3, per_shard=4)
    failed = relay.publish(batch)
    shard_2 = [m.message_id for m in batch if m.shard_identifier == 2]
    assert set(failed) == set(shard_2[1:])
    assert failed[shard_2[2]] is failed[shard_2[1]] is failed[shard_2[3]]
    assert sequences(broker.consume(queue, 9)) == {
        "ORGANIZATION:1": [0, 1, 2, 3],
        "ORGANIZATION:2": [0],
        "ORGANIZATION:3": [0, 1, 2, 3],
    }


def test_messages_the_broker_nacks_fail_and_their_shards_publish_no_further(make_relay, broker):
    """A queue full with overflow reject-publish: the broker nacks what it cannot take."""
    queue = broker.queue(**{"x-max-length": 2, "x-overflow": "reject-publish"})
    relay = make_relay()
    batch = messages(shards=3, per_shard=2)  # s1n0 s2n0 s3n0 s1n1 s2n1 s3n1
    failed = relay.publish(batch)
    assert set(failed) == {m.message_id for m in batch[2:]}
    assert "nacked" in str(failed[batch[2].message_id])
    assert relay.publish(messages(shards=1, per_shard=1, first_shard=9)) != {}  # still full
    assert [payload(m) for m in broker.consume(queue, 3, timeout=1.0)] == [
        {"shard": 1, "n": 0},
        {"shard": 2, "n": 0},
    ]


def test_threads_publishing_at_once_each_keep_their_shard_in_order(make_relay, broker):
    queue = broker.queue()
    relay = make_relay()
    errors = []

    def publish_shard(shard):
        for message in messages(shards=1, per_shard=15, first_shard=shard):
            errors.extend(relay.publish([message]).values())

    threads = [threading.Thread(target=publish_shard, args=(shard,)) for shard in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    consumed = broker.consume(queue, 8 * 15)
    assert len(consumed) == 8 * 15  # none published twice: no confirm went astray
    assert sequences(consumed) == {f"ORGANIZATION:{shard}": list(range(15)) for shard in range(8)}


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_broker_cut_mid_drain_loses_nothing_and_keeps_shard_order(
    make_relay, broker, calls, settings, concurrency
):
    settings.OUTBOX_CONCURRENCY = concurrency
    queue = broker.queue()
    with TcpProxy("127.0.0.1", BROKER_PORT) as proxy:
        make_relay(port=proxy.port)
        rows = write(shards=4, per_shard=5)
        calls.during_call = cut_after(7, proxy)
        stats = drain_outboxes([RegionOutbox])
        assert stats.failures >= 1
        assert 0 < RegionOutbox.objects.count() < len(rows)

        calls.during_call = None
        proxy.start()
        for _ in range(10):
            make_due()
            drain_outboxes([RegionOutbox])
            if not RegionOutbox.objects.exists():
                break
        assert not RegionOutbox.objects.exists()
    consumed = broker.consume(queue, len(rows))
    assert {m.properties["message_id"] for m in consumed} == {str(r.message_id) for r in rows}
    assert sequences(consumed) == {
        f"ORGANIZATION:{shard}": [0, 1, 2, 3, 4] for shard in range(1, 5)
    }


def cut_after(deliveries, proxy):
    """A hook for the test receiver (called before the relay, for each message): cut the
    line once `deliveries` messages went through."""
    seen = []
    lock = threading.Lock()

    def hook(sender, kwargs):
        with lock:
            seen.append(kwargs["message_id"])
            if len(seen) == deliveries + 1:
                proxy.stop()

    return hook


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://127.0.0.1:6379/0", "is not an AMQP URL"),
        ("amqp://guest:guest@127.0.0.1:port//", "does not parse"),
    ],
)
def test_check_reports_a_bad_url_and_an_unknown_template_field(make_relay, url, problem):
    make_relay(routing_key="{scope}.{kind}")
    relay = AmqpRelay("bad-amqp", url=url).connect(Category.AUDIT_EVENT)
    try:
        errors = [error for error in run_checks() if error.id == "outbox.E023"]
    finally:
        relay.disconnect()
    texts = [error.msg for error in errors]
    assert any("routing_key template '{scope}.{kind}' names {kind}" in text for text in texts)
    assert any(problem in text and "'bad-amqp'" in text for text in texts)
    assert len(errors) == 2


def test_without_kombu_creating_the_relay_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kombu", None)
    with pytest.raises(OutboxConfigurationError, match=r'pip install "django-outboxes\[amqp\]"'):
        AmqpRelay("no-client")
