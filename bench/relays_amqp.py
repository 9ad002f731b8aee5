"""RabbitMQ in the relays section (`bench.relays`): an `AmqpRelay` (publisher confirms)
against a raw kombu loop with confirms, on an exchange and a queue of the run's own.

The queue is bound to the exchange before anything is published, so the broker stores
every message (persistent, as the relay sends them) in both runs; it is read back, then
purged, between them, and deleted with the exchange at the end.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

from bench.relays_common import Counting, RawMessage, batches, cloudevent, subject
from outbox.relays.amqp import AmqpRelay

CONFIRM_TIMEOUT_S = 30.0


class CountingAmqpRelay(Counting, AmqpRelay):
    pass


class Amqp:
    kind = "amqp"
    title = "RabbitMQ, publisher confirms"
    floor = "kombu: publish a batch in confirm mode, wait for all its acks"

    def __init__(self) -> None:
        import kombu

        self.url = os.environ.get("OUTBOX_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
        self.name = f"outbox-bench-relays-{secrets.token_hex(4)}"
        self.connection = kombu.Connection(self.url, connect_timeout=5)
        self.exchange = kombu.Exchange(self.name, "topic", durable=True)
        # x-expires: a queue left by a run that died goes away by itself.
        self.queue = kombu.Queue(
            self.name,
            self.exchange,
            routing_key="#",
            durable=True,
            queue_arguments={"x-expires": 600_000},
        )
        self.connection.ensure_connection(max_retries=1)  # no broker: skipped, at once
        channel = self.connection.default_channel
        self.exchange(channel).declare()
        self.queue(channel).declare()

    def relay(self, name: str) -> CountingAmqpRelay:
        return CountingAmqpRelay(
            name,
            url=self.url,
            exchange=self.name,
            routing_key="{category}",
            confirm_timeout=CONFIRM_TIMEOUT_S,
        )

    def read(self, count: int, timeout: float = 15.0) -> list[tuple[str, int]]:
        """What the queue holds, in the order it gives it: up to `count` messages, or
        fewer if none comes for `timeout`."""
        read: list[tuple[str, int]] = []

        def take(message: Any) -> None:
            read.append((message.headers["outbox-shard"], subject(message.body)))

        with self.connection.Consumer(self.queue, on_message=take, no_ack=True):
            while len(read) < count:
                try:
                    self.connection.drain_events(timeout=timeout)
                except TimeoutError:
                    break
        return read

    def clear(self) -> None:
        self.queue(self.connection.default_channel).purge()

    def raw(self, messages: list[RawMessage], size: int) -> float:
        """The raw floor: one connection and channel in confirm mode, each batch
        published whole, then its acks awaited. Seconds taken (connecting untimed)."""
        import kombu

        with kombu.Connection(self.url, connect_timeout=5) as connection:
            channel = connection.channel()
            channel.confirm_select()
            acked = [0]

            def on_ack(delivery_tag: int, multiple: bool) -> None:
                acked[0] = delivery_tag if multiple else acked[0] + 1

            channel.events["basic_ack"].add(on_ack)
            producer = kombu.Producer(channel, exchange=self.exchange, auto_declare=False)
            started = time.perf_counter()
            published = 0
            for batch in batches(messages, size):
                for message in batch:
                    message_id, body, headers = cloudevent(message)
                    producer.publish(
                        body,
                        routing_key="relay_publish",
                        delivery_mode=2,
                        content_type="application/cloudevents+json",
                        content_encoding="utf-8",
                        headers=headers,
                        message_id=message_id,
                    )
                published += len(batch)
                while acked[0] < published:
                    connection.drain_events(timeout=CONFIRM_TIMEOUT_S)
            return time.perf_counter() - started

    def close(self) -> None:
        channel = self.connection.default_channel
        self.queue(channel).delete()
        self.exchange(channel).delete()
        self.connection.release()
