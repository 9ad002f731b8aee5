"""KafkaRelay: each message as a Kafka record, keyed by its shard.

Client: confluent-kafka (librdkafka), the extra ``django-outboxes[kafka]``. One producer
per relay, made at the first publish in each process (librdkafka's threads do not survive
a fork) and shared by the engine's threads, as librdkafka allows. The producer is
idempotent with ``acks=all``: the broker keeps each partition's records in the order
produced, without duplicates from the client's own retries, and a record counts as
delivered only once every in-sync replica has it.

A record's key is `Message.shard_key`, so a shard's messages land in one partition, in
order. Its headers are `Message.relay_headers()` and ``content-type``, plus the
CloudEvents attributes as ``ce_`` headers with a binary envelope (the CloudEvents Kafka
binding). A batch is produced at once and flushed once; each record's delivery report
says whether it was delivered, and a record with no report by `timeout` counts as failed.
"""

from __future__ import annotations

import logging
import os
import re
import string
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.core.checks import CheckMessage

from outbox.exceptions import OutboxConfigurationError
from outbox.relays.base import Failures, Message, Relay, client_library
from outbox.relays.envelope import Envelope
from outbox.relays.kafka_reports import (
    Reports,
    as_failure,
    failures_by_shard,
    is_fatal,
    produce_in_turn,
)

if TYPE_CHECKING:
    from confluent_kafka import Producer

__all__ = ["KafkaRelay"]

logger = logging.getLogger(__name__)

# A topic: a template of `TOPIC_FIELDS`, or a callable given the message.
Topic = str | Callable[[Message], str]
TOPIC_FIELDS = ("category", "scope")
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# How long one wait on the producer lasts before the batch's own reports are looked at
# again (reports may be served by another thread's flush).
_WAIT_SLICE = 0.01

# Producers of a parent process, kept unreleased in a forked child: releasing them there
# would wait for threads the child does not have.
_inherited: list[Producer] = []


class KafkaRelay(Relay):
    """Publish each message to Kafka.

    `config` is librdkafka's configuration (``{"bootstrap.servers": "kafka:9092", ...}``);
    the relay adds ``enable.idempotence`` (and refuses it turned off), ``acks=all``,
    ``message.timeout.ms`` from `timeout`, a ``client.id`` and a logger, unless given.
    `topic` is a template of ``{category}`` and ``{scope}`` (their names in lower case)
    or a callable given the `Message`. `timeout`: seconds a batch waits for its
    delivery reports; a record not reported by then counts as failed.
    """

    extra = "kafka"

    def __init__(
        self,
        name: str,
        *,
        config: Mapping[str, Any],
        topic: Topic = "outbox.{category}",
        envelope: Envelope | str = "cloudevents",
        timeout: float = 30.0,
    ) -> None:
        super().__init__(name, envelope=envelope)
        self._kafka = client_library("confluent_kafka", "KafkaRelay", "confluent-kafka", "kafka")
        if str(config.get("enable.idempotence", True)).lower() not in ("true", "1"):
            raise OutboxConfigurationError(
                f"Relay {name!r}: KafkaRelay needs enable.idempotence (it keeps each "
                f"shard's records in order through the producer's retries); remove "
                f"enable.idempotence from its config."
            )
        self.topic = topic
        self.timeout = timeout
        self.config: dict[str, Any] = {
            "acks": "all",
            "message.timeout.ms": max(int(timeout * 1000), 1),
            "client.id": f"outbox-{name}",
            "logger": logger,
            **config,
            "enable.idempotence": True,
        }
        self._producer: Producer | None = None
        self._pid = 0
        self._lock = threading.Lock()

    # -- publishing -------------------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> Failures:
        if not messages:
            return {}
        producer = self.producer()
        reports = Reports()
        refused = produce_in_turn(
            messages, lambda message: self._produce(producer, message, reports)
        )
        self._wait(producer, reports)
        failed = failures_by_shard(messages, refused, reports, self.timeout)
        if any(is_fatal(error) for error in failed.values()):
            self._drop(producer)
        return failed

    def topic_for(self, message: Message) -> str:
        """The topic `message` is produced to."""
        if callable(self.topic):
            return self.topic(message)
        return self.topic.format(
            category=message.category.name.lower(), scope=message.scope.name.lower()
        )

    def producer(self) -> Producer:
        """This process's producer, made at first use."""
        producer, pid = self._producer, os.getpid()
        if producer is not None and self._pid == pid:
            return producer
        with self._lock:
            if self._producer is not None and self._pid != pid:
                _inherited.append(self._producer)
                self._producer = None
            if self._producer is None:
                self._producer, self._pid = self._kafka.Producer(self.config), pid
            return self._producer

    def _produce(self, producer: Producer, message: Message, reports: Reports) -> None:
        headers = {**message.relay_headers(), "content-type": self.envelope.content_type}
        for attribute, value in self.envelope.attributes(message).items():
            headers[f"ce_{attribute}"] = value
        record: dict[str, Any] = {
            "topic": self.topic_for(message),
            "key": message.shard_key.encode(),
            "value": self.envelope.body(message),
            "headers": [(name, value.encode()) for name, value in headers.items()],
        }
        on_delivery = reports.expect(message.message_id)
        try:
            try:
                producer.produce(**record, on_delivery=on_delivery)
            except BufferError:  # the local queue is full: let it drain, then once more
                producer.flush(min(self.timeout, 1.0))
                producer.produce(**record, on_delivery=on_delivery)
        except BaseException as error:
            reports.cancel()
            failure = as_failure(error) if isinstance(error, Exception) else error
            if failure is error:
                raise
            raise failure from error

    def _wait(self, producer: Producer, reports: Reports) -> None:
        """Send what is queued at once and serve delivery reports until this batch has
        all of its own, or `timeout` passed."""
        deadline = time.monotonic() + self.timeout
        while not reports.done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if producer.flush(min(remaining, _WAIT_SLICE)) == 0:
                # Nothing queued: another thread is running the last of our reports.
                reports.done.wait(min(remaining, 0.01))

    def _drop(self, producer: Producer) -> None:
        """Forget a producer a fatal error left unusable; the next publish makes one."""
        with self._lock:
            if self._producer is producer:
                self._producer = None

    # -- declaring --------------------------------------------------------------------

    def check(self) -> list[CheckMessage]:
        errors = _topic_errors(self.topic) if isinstance(self.topic, str) else []
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            errors.append(f"timeout must be a number of seconds above 0, not {self.timeout!r}")
        servers = ("bootstrap.servers", "metadata.broker.list", "test.mock.num.brokers")
        if not any(self.config.get(key) for key in servers):
            errors.append("its config needs bootstrap.servers (the Kafka brokers to reach)")
        else:
            errors.extend(self._config_errors())
        return [self.error(text) for text in errors]

    def _config_errors(self) -> list[str]:
        """librdkafka's verdict on the configuration: a producer made and let go."""
        try:
            self._kafka.Producer(self.config)
        except (self._kafka.KafkaException, TypeError, ValueError) as error:
            reason = error.args[0] if error.args else error
            return [f"Kafka refuses its config: {getattr(reason, 'str', reason.__str__)()}"]
        return []

    def close(self) -> None:
        """Wait (up to `timeout`) for records still queued, then let the producer go."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None and self._pid == os.getpid():
            producer.flush(self.timeout)


def _topic_errors(template: str) -> list[str]:
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        return [f"topic template {template!r} does not parse: {error}"]
    unknown = sorted(fields - set(TOPIC_FIELDS))
    if unknown:
        return [
            f"topic template {template!r} names unknown fields {unknown}; it may use "
            f"{{category}} and {{scope}}"
        ]
    sample = template.format(category="category", scope="scope")
    if not _TOPIC_NAME.match(sample):
        return [f"topic template {template!r} makes a topic name Kafka refuses ({sample!r})"]
    return []
