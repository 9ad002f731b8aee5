"""Kafka in the relays section (`bench.relays`): a `KafkaRelay` against a raw producer
loop (one flush per batch), both on librdkafka's mock cluster (`test.mock.num.brokers`),
a Kafka protocol server on local ports that a client of the harness owns for the run.
Each run of the relay and of the raw loop produces to a topic of its own (made by its
first record, with the mock's 4 partitions). A mock partition keeps only its last 5 MB
(or 100,000 message sets) and drops older ones, so a run holds at most `PER_SHARD`
messages per shard: about 17 MB of CloudEvents over 1,000 shards, read back whole. The
cluster, and every topic on it, goes away with its owner at the end."""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

from bench.relays_common import Counting, RawMessage, batches, cloudevent, subject
from outbox.relays.kafka import KafkaRelay

BROKERS = 3
PER_SHARD = 30  # messages per shard at most: what the mock's partitions keep
TIMEOUT_S = 30.0


class CountingKafkaRelay(Counting, KafkaRelay):
    pass


class Kafka:
    kind = "kafka"
    max_per_shard = PER_SHARD
    title = f"Kafka, librdkafka mock cluster ({BROKERS} brokers)"
    floor = "confluent-kafka: produce a batch, then one flush"

    def __init__(self) -> None:
        import confluent_kafka

        self.kafka = confluent_kafka
        self.owner: Any = confluent_kafka.Producer(
            {"test.mock.num.brokers": BROKERS, "log_level": 4}
        )
        brokers = self.owner.list_topics(timeout=10).brokers.values()
        self.bootstrap = ",".join(f"{broker.host}:{broker.port}" for broker in brokers)
        self.topic = self.raw_topic = ""

    def _new_topic(self) -> str:
        return f"outbox-bench-relays-{secrets.token_hex(4)}"

    def relay(self, name: str) -> CountingKafkaRelay:
        self.topic = self._new_topic()
        return CountingKafkaRelay(
            name, config={"bootstrap.servers": self.bootstrap}, topic=self.topic, timeout=TIMEOUT_S
        )

    def read(self, count: int, timeout: float = 15.0) -> list[tuple[str, int]]:
        """The relay's topic, every partition from its start: up to `count` records, or
        fewer if none comes for `timeout`. Records of one partition come in its order."""
        consumer = self.kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"outbox-bench-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        try:
            partitions = self.owner.list_topics(timeout=10).topics[self.topic].partitions
            consumer.assign(
                [
                    self.kafka.TopicPartition(self.topic, partition, self.kafka.OFFSET_BEGINNING)
                    for partition in partitions
                ]
            )
            read: list[tuple[str, int]] = []
            idle_until = time.monotonic() + timeout
            while len(read) < count and time.monotonic() < idle_until:
                # consume() waits for all it asks for: ask for no more than is owed.
                records = consumer.consume(num_messages=min(count - len(read), 10_000), timeout=1)
                if records:
                    idle_until = time.monotonic() + timeout
                for record in records:
                    if record.error() is None:
                        read.append((record.key().decode(), subject(record.value())))
            return read
        finally:
            consumer.close()

    def clear(self) -> None:
        """Nothing: each run has its own topics."""

    def raw(self, messages: list[RawMessage], size: int) -> float:
        """The raw floor: an idempotent producer with acks=all (as the relay's), each
        batch produced, then flushed once. Seconds taken (its first record, which makes
        the connections, untimed)."""
        self.raw_topic = self._new_topic()
        producer = self.kafka.Producer(
            {"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True}
        )
        failed: list[Any] = []

        def report(error: Any, record: Any) -> None:
            if error is not None:
                failed.append(error)

        producer.produce(self.raw_topic, key=b"warm-up", value=b"{}", on_delivery=report)
        producer.flush(TIMEOUT_S)
        started = time.perf_counter()
        for batch in batches(messages, size):
            for message in batch:
                _, body, headers = cloudevent(message)
                headers["content-type"] = "application/cloudevents+json"
                producer.produce(
                    self.raw_topic,
                    key=message.key.encode(),
                    value=body,
                    headers=[(name, value.encode()) for name, value in headers.items()],
                    on_delivery=report,
                )
            producer.flush(TIMEOUT_S)
        seconds = time.perf_counter() - started
        if failed:
            raise RuntimeError(f"the raw Kafka loop had {len(failed)} failed records: {failed[0]}")
        return seconds

    def close(self) -> None:
        self.owner.flush(1.0)
        self.owner = None
