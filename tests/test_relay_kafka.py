"""KafkaRelay against librdkafka's mock cluster: a Kafka protocol server on local TCP ports
that librdkafka starts inside one client (`test.mock.num.brokers`). The relay and the
test's consumer reach it through its bootstrap address like any Kafka cluster; the
messages are written in outbox_context and drained by the real engine."""

import json
import threading
import time
import uuid
from collections import defaultdict
from datetime import datetime, timezone

import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError, PermanentFailure
from outbox.models import ControlOutbox, RegionOutbox
from outbox.relays import KafkaRelay, Message
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.relay_helpers import make_due, messages
from tests.testapp.categories import Category, Scope

kafka = pytest.importorskip("confluent_kafka")
from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka  # noqa: E402
from cloudevents.core.formats.json import JSONFormat  # noqa: E402

pytestmark = committing


class MockCluster:
    """A mock Kafka cluster of three brokers, owned by a client of its own."""

    def __init__(self) -> None:
        self.owner = kafka.Producer({"test.mock.num.brokers": 3})
        brokers = self.owner.list_topics(timeout=10).brokers.values()
        self.bootstrap = ",".join(f"{broker.host}:{broker.port}" for broker in brokers)

    def create_topic(self, topic: str) -> None:
        """Make `topic` exist (the owner may auto-create topics; relays in the failure
        tests may not)."""
        self.owner.list_topics(topic=topic, timeout=10)

    def records(self, topic: str, count: int, timeout: float = 15.0) -> list:
        """The first `count` records of `topic`, from every partition, in the order
        consumed; fewer if no more come within `timeout`."""
        consumer = kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"test-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "allow.auto.create.topics": False,
            }
        )
        try:
            partitions = self.owner.list_topics(timeout=10).topics[topic].partitions
            consumer.assign(
                [
                    kafka.TopicPartition(topic, partition, kafka.OFFSET_BEGINNING)
                    for partition in partitions
                ]
            )
            found = []
            deadline = time.monotonic() + timeout
            while len(found) < count and time.monotonic() < deadline:
                record = consumer.poll(0.2)
                if record is not None:
                    assert record.error() is None, record.error()
                    found.append(record)
            return found
        finally:
            consumer.close()

    def topics(self) -> set[str]:
        return set(self.owner.list_topics(timeout=10).topics)


@pytest.fixture(scope="module")
def cluster():
    return MockCluster()


@pytest.fixture
def prefix():
    """Topics of this test's own: `<prefix>.<category>`."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def relays():
    """Relays made by a test, disconnected (and their producers closed) at its end."""
    made = []
    yield made
    for relay in made:
        relay.disconnect()


@pytest.fixture
def make_relay(cluster, prefix, relays):
    def make(*targets, config=None, **options):
        options.setdefault("topic", f"{prefix}.{{category}}")
        relay = KafkaRelay(
            f"kafka-{uuid.uuid4().hex[:8]}",
            config={"bootstrap.servers": cluster.bootstrap, **(config or {})},
            **options,
        )
        relays.append(relay)
        return relay.connect(*(targets or [Category.AUDIT_EVENT]))

    return make


def headers_of(record) -> dict[str, str]:
    return {name: value.decode() for name, value in record.headers() or []}


def event_of(record):
    headers = {name: value for name, value in record.headers() or []}
    return from_kafka(
        KafkaMessage(headers=headers, key=record.key(), value=record.value()), JSONFormat()
    )


def write(shards: int, per_shard: int) -> list[RegionOutbox]:
    """`per_shard` messages to each shard, one transaction per round, left for the drain."""
    rows = []
    for round_ in range(per_shard):
        with outbox_context(transaction.atomic(), flush=False):
            rows.extend(
                RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 100 + round_)
                for shard in range(shards)
            )
    return rows


def test_a_shard_stays_in_one_partition_in_order(make_relay, cluster, prefix):
    make_relay(Category.AUDIT_EVENT)
    rows = write(shards=6, per_shard=5)
    drain_outboxes()
    assert not RegionOutbox.objects.exists()

    records = cluster.records(f"{prefix}.audit_event", count=30)
    by_key = defaultdict(list)
    for record in records:
        by_key[record.key().decode()].append(record)
    assert sorted(by_key) == [f"ORGANIZATION:{shard}" for shard in range(6)]
    for shard in range(6):
        shard_records = by_key[f"ORGANIZATION:{shard}"]
        assert len({record.partition() for record in shard_records}) == 1
        offsets = [record.offset() for record in shard_records]
        assert offsets == sorted(offsets)
        ids = [headers_of(record)["outbox-message-id"] for record in shard_records]
        assert ids == [str(row.message_id) for row in rows if row.shard_identifier == shard]
    # Six shards over four partitions: more than one partition is in use.
    assert len({record.partition() for record in records}) > 1


def test_slot_threads_share_the_relay_each_shard_in_order(
    make_relay, cluster, prefix, calls, settings
):
    settings.OUTBOX_CONCURRENCY = 4
    calls.during_call = lambda sender, kwargs: time.sleep(0.01)  # the shards' calls overlap
    make_relay(Category.AUDIT_EVENT)
    rows = write(shards=12, per_shard=4)
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    by_key = defaultdict(list)
    for record in cluster.records(f"{prefix}.audit_event", count=48):
        by_key[record.key().decode()].append(headers_of(record)["outbox-message-id"])
    assert by_key == {
        f"ORGANIZATION:{shard}": [str(r.message_id) for r in rows if r.shard_identifier == shard]
        for shard in range(12)
    }


def test_structured_cloudevents_and_the_relay_headers(make_relay, cluster, prefix):
    make_relay(Category.AUDIT_EVENT)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with outbox_context(transaction.atomic(), flush=True):  # the synchronous flush
        row = RegionOutboxFactory(
            shard_identifier=7,
            object_identifier=42,
            payload={"name": "acme", "seats": 3},
            headers={"traceparent": traceparent, "tenant": "acme"},
        )
    [record] = cluster.records(f"{prefix}.audit_event", count=1)
    assert record.key() == b"ORGANIZATION:7"
    assert headers_of(record) == {
        "outbox-message-id": str(row.message_id),
        "outbox-category": "AUDIT_EVENT",
        "outbox-shard": "ORGANIZATION:7",
        "outbox-attempt": "1",
        "traceparent": traceparent,
        "tenant": "acme",
        "content-type": "application/cloudevents+json",
    }
    event = event_of(record)
    assert event.get_id() == str(row.message_id)
    assert event.get_type() == "audit_event"
    assert event.get_source() == "/outbox/organization"
    assert event.get_subject() == "42"
    assert event.get_data() == {"name": "acme", "seats": 3}
    assert event.get_extension("traceparent") == traceparent
    written = datetime.fromtimestamp((row.message_id.int >> 80) / 1000, tz=timezone.utc)
    assert event.get_time() == written  # the millisecond in the row's version 7 id


def test_binary_cloudevents_travel_as_ce_headers(make_relay, cluster, prefix):
    make_relay(Category.USER_UPDATE, envelope="cloudevents-binary")
    row = ControlOutboxFactory(shard_identifier=3, object_identifier=9, payload={"email": "a@b"})
    drain_outboxes()
    [record] = cluster.records(f"{prefix}.user_update", count=1)
    assert record.key() == b"USER:3:us"  # a control shard: its region too
    headers = headers_of(record)
    assert headers["content-type"] == "application/json"
    assert headers["ce_id"] == headers["outbox-message-id"] == str(row.message_id)
    assert {name for name in headers if name.startswith("ce_")} == {
        "ce_specversion", "ce_id", "ce_source", "ce_type", "ce_subject", "ce_time",
    }  # fmt: skip
    assert json.loads(record.value()) == {"email": "a@b"}
    event = event_of(record)
    assert (event.get_id(), event.get_type(), event.get_source(), event.get_subject()) == (
        str(row.message_id), "user_update", "/outbox/user", "9",
    )  # fmt: skip
    assert event.get_data() == {"email": "a@b"}
    assert not ControlOutbox.objects.exists()


def test_a_bare_payload_and_topics_from_a_callable(make_relay, cluster, prefix):
    topic = f"{prefix}-by-scope"
    make_relay(Scope.ORGANIZATION, envelope="bare", topic=lambda message: topic)
    RegionOutboxFactory(shard_identifier=1, category=Category.ORGANIZATION_UPDATE, payload=[1])
    RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT, payload={"a": None})
    drain_outboxes()
    records = cluster.records(topic, count=2)
    assert [json.loads(record.value()) for record in records] == [[1], {"a": None}]
    assert [headers_of(record)["outbox-category"] for record in records] == [
        "ORGANIZATION_UPDATE",
        "AUDIT_EVENT",
    ]
    assert headers_of(records[0])["content-type"] == "application/json"


def test_an_unknown_topic_fails_the_attempt_and_the_row_stays_for_retry(
    make_relay, cluster, prefix, calls
):
    # librdkafka gives up on the record after a second: its delivery report says so.
    config = {"allow.auto.create.topics": False, "message.timeout.ms": 1000}
    make_relay(config=config, timeout=5.0)
    RegionOutboxFactory(shard_identifier=4)
    drain_outboxes()
    row = RegionOutbox.objects.get()
    assert row.attempts == 1
    assert "KafkaException" in row.last_error and "Message timed out" in row.last_error
    assert len(calls.calls) == 1  # the app's own receiver of the category did its part

    cluster.create_topic(f"{prefix}.audit_event")
    make_due()
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    [record] = cluster.records(f"{prefix}.audit_event", count=1)
    assert headers_of(record)["outbox-attempt"] == "2"
    assert len(calls.calls) == 1  # not called again on the retry


def direct_messages(shards: int, per_shard: int, payload=lambda shard, n: {"n": n}):
    """Messages as a batched engine would hand them over: shard by shard interleaved."""
    return messages(shards, per_shard, first_shard=0, payload=payload)


def test_a_batch_stops_a_shard_at_its_first_refused_message(make_relay, cluster, prefix):
    relay = make_relay(config={"message.max.bytes": 1000})
    too_large = {"blob": "x" * 2000}
    messages = direct_messages(
        4, 3, lambda shard, n: too_large if (shard, n) == (2, 1) else {"n": n}
    )
    failed = relay.publish(messages)

    by_place = {(m.shard_identifier, m.object_identifier): m.message_id for m in messages}
    assert set(failed) == {by_place[2, 1], by_place[2, 2]}
    assert isinstance(failed[by_place[2, 1]], PermanentFailure)
    # The shard's next message was held back, as an ordinary failure (not a dead letter).
    assert not isinstance(failed[by_place[2, 2]], PermanentFailure)
    # Wait for an eleventh record a while: there is none.
    records = cluster.records(f"{prefix}.audit_event", count=11, timeout=3.0)
    published = [
        (record.key().decode(), json.loads(record.value())["data"]["n"]) for record in records
    ]
    assert sorted(published) == sorted(
        [(f"ORGANIZATION:{shard}", n) for shard in (0, 1, 3) for n in range(3)]
        + [("ORGANIZATION:2", 0)]
    )


def test_a_failed_delivery_report_fails_the_shards_later_messages(make_relay, cluster, prefix):
    """A shard's messages may go to several topics (a topic per category): a later one
    delivered after an earlier one failed is reported failed too, to be sent again after
    it, in order."""
    existing, missing = f"{prefix}.there", f"{prefix}.missing"
    cluster.create_topic(existing)
    config = {"allow.auto.create.topics": False, "message.timeout.ms": 1000}
    topic = lambda message: missing if message.object_identifier == 1 else existing  # noqa: E731
    relay = make_relay(config=config, topic=topic, timeout=5.0)
    messages = direct_messages(2, 3)
    failed = relay.publish(messages)

    by_place = {(m.shard_identifier, m.object_identifier): m.message_id for m in messages}
    assert set(failed) == {by_place[0, 1], by_place[0, 2], by_place[1, 1], by_place[1, 2]}
    assert "Message timed out" in str(failed[by_place[0, 1]])
    assert failed[by_place[0, 2]] is failed[by_place[0, 1]]
    # Delivered all the same: sent again on the retry (at least once).
    assert len(cluster.records(existing, count=4)) == 4


def test_a_record_without_a_delivery_report_in_time_counts_as_failed(make_relay, prefix):
    relay = make_relay(
        config={"allow.auto.create.topics": False, "message.timeout.ms": 60_000}, timeout=1.0
    )
    [message] = direct_messages(1, 1)
    started = time.monotonic()
    failed = relay.publish([message])
    assert time.monotonic() - started < 5
    assert isinstance(failed[message.message_id], TimeoutError)


def test_threads_share_one_producer_each_batch_gets_its_own_reports(make_relay, cluster, prefix):
    relay = make_relay()
    results = {}

    def publish(thread: int) -> None:
        batch = [
            Message(
                message_id=uuid.uuid4(),
                category=Category.AUDIT_EVENT,
                scope=Scope.ORGANIZATION,
                shard_identifier=thread,
                object_identifier=n,
                payload={"n": n},
            )
            for n in range(25)
        ]
        results[thread] = relay.publish(batch)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {n: {} for n in range(8)}
    records = cluster.records(f"{prefix}.audit_event", count=200)
    by_key = defaultdict(list)
    for record in records:
        by_key[record.key().decode()].append(json.loads(record.value())["data"]["n"])
    assert by_key == {f"ORGANIZATION:{n}": list(range(25)) for n in range(8)}


def test_checks(cluster):
    def errors(**options):
        options.setdefault("config", {"bootstrap.servers": cluster.bootstrap})
        return [error.msg for error in KafkaRelay("checked", **options).check()]

    assert errors() == []
    assert errors(topic="outbox.{kind}") == [
        "Relay 'checked': topic template 'outbox.{kind}' names unknown fields ['kind']; "
        "it may use {category} and {scope}"
    ]
    assert "makes a topic name Kafka refuses" in errors(topic="outbox/{category}")[0]
    assert "does not parse" in errors(topic="outbox.{category")[0]
    assert errors(config={}) == [
        "Relay 'checked': its config needs bootstrap.servers (the Kafka brokers to reach)"
    ]
    [refused] = errors(config={"bootstrap.servers": cluster.bootstrap, "linger.msec": 5})
    assert 'Kafka refuses its config: No such configuration property: "linger.msec"' in refused
    assert "timeout must be" in errors(timeout=0)[0]
    assert [error.id for error in KafkaRelay("e", config={}).check()] == ["outbox.E023"]


def test_the_idempotent_producer_cannot_be_turned_off():
    with pytest.raises(OutboxConfigurationError, match=r"needs enable\.idempotence"):
        KafkaRelay("plain", config={"bootstrap.servers": "k:9092", "enable.idempotence": False})


def test_without_confluent_kafka_the_relay_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "confluent_kafka", None)
    with pytest.raises(OutboxConfigurationError, match=r'pip install "django-outboxes\[kafka\]"'):
        KafkaRelay("no-client", config={"bootstrap.servers": "k:9092"})
