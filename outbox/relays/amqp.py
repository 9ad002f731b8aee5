"""AmqpRelay: each message published to a RabbitMQ exchange through kombu (py-amqp),
persistent, with publisher confirms::

    AmqpRelay("events", url="amqp://app:secret@rabbit:5672/app", exchange="events",
              routing_key="{scope}.{category}").connect(Scope.ORGANIZATION)

On the wire: the body and content type from the envelope (content encoding utf-8),
``delivery_mode`` 2 (persistent), the ``message_id`` property = the message id, the
headers = `Message.relay_headers` (``outbox-message-id``, ``outbox-category``,
``outbox-shard``, ``outbox-attempt``, the writer's headers: ``traceparent`` ...) and, with
a binary CloudEvents envelope, its attributes as ``cloudEvents:id``, ``cloudEvents:type``
... (the prefix of the CloudEvents AMQP binding).

A message counts as published once the broker confirms it (``basic.ack``); a nack, a
message the broker returns (`mandatory`), a closed channel or a lost connection is a
failure the engine retries. A batch goes out in waves (`outbox.relays.waves`): each
wave published whole, then its confirms awaited once. Each thread publishes on its own
connection, taken from the relay's idle ones or opened; a failed one is dropped, and
the next call opens another.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage

from outbox.exceptions import OutboxConfigurationError, PermanentFailure
from outbox.relays.base import Failures, Message, Relay, client_library
from outbox.relays.broker_urls import url_problem
from outbox.relays.destination import Destination
from outbox.relays.envelope import Envelope
from outbox.relays.waves import publish_in_waves

__all__ = ["AmqpRelay", "BrokerRefused"]

SCHEMES = ("amqp", "amqps", "pyamqp")


class BrokerRefused(Exception):
    """The broker did not take a message: it nacked it, or returned it unroutable."""


@dataclass(frozen=True)
class _Outgoing:
    """One message as it is put on the wire."""

    message_id: uuid.UUID
    routing_key: str
    body: bytes
    headers: dict[str, str]


class AmqpRelay(Relay):
    """Publish to `exchange` (declared durable on each new connection unless `declare`
    is False) with `routing_key`, a template of the message's fields or a callable
    (`outbox.relays.destination`; default the category's name in lower case).

    `mandatory`: a message no queue is bound to take is reported failed (retried)
    instead of dropped by the broker. `confirm_timeout`: how long a batch waits for the
    broker's confirms before it counts as failed. `connection_options`: more keyword
    arguments of `kombu.Connection` (``ssl``, ``heartbeat``, ``transport_options`` ...).
    """

    extra = "amqp"

    def __init__(
        self,
        name: str,
        *,
        url: str = "amqp://guest:guest@127.0.0.1:5672//",
        exchange: str = "outbox",
        exchange_type: str = "topic",
        routing_key: str | Callable[[Message], str] = "{category}",
        envelope: Envelope | str = "cloudevents",
        declare: bool = True,
        mandatory: bool = False,
        connect_timeout: float = 5.0,
        confirm_timeout: float = 10.0,
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._kombu = client_library("kombu", "AmqpRelay", "kombu", "amqp")
        super().__init__(name, envelope=envelope)
        self.url = url
        self.exchange = exchange
        self.exchange_type = exchange_type
        self.routing_key = Destination(routing_key, "routing_key")
        self.declare = declare
        self.mandatory = mandatory
        self.connect_timeout = connect_timeout
        self.confirm_timeout = confirm_timeout
        self.connection_options = dict(connection_options or {})
        self._idle: list[_Channel] = []
        self._lock = threading.Lock()

    def publish(self, messages: Sequence[Message]) -> Failures:
        return publish_in_waves(messages, self._publish_wave)

    def check(self) -> list[CheckMessage]:
        found: list[CheckMessage] = [self.error(problem) for problem in self.routing_key.problems()]
        problem = _url_problem(self.url)
        if problem:
            found.append(self.error(problem))
        return found

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for channel in idle:
            channel.close()

    # -- one wave -----------------------------------------------------------------

    def _publish_wave(self, wave: list[Message]) -> Failures:
        failed: dict[uuid.UUID, BaseException] = {}
        outgoing = []
        for message in wave:
            try:
                outgoing.append(self._outgoing(message))
            except Exception as error:  # a routing key or body that cannot be made
                failed[message.message_id] = error
        if outgoing:
            failed.update(self._send(outgoing))
        return failed

    def _send(self, outgoing: list[_Outgoing]) -> Failures:
        """Publish on an idle connection; if that fails (the broker may have closed it
        while it sat idle), once more on a new one. Repeating the wave can only repeat
        a message, one per shard at most, never reorder a shard."""
        with self._lock:
            channel = self._idle.pop() if self._idle else None
        if channel is not None:
            try:
                return self._send_on(channel, outgoing)
            except Exception:
                pass
        return self._send_on(_Channel(self), outgoing)

    def _send_on(self, channel: _Channel, outgoing: list[_Outgoing]) -> Failures:
        try:
            failed = channel.publish(outgoing, self.confirm_timeout)
        except BaseException:
            channel.drop()
            raise
        with self._lock:
            self._idle.append(channel)
        return failed

    def _outgoing(self, message: Message) -> _Outgoing:
        headers = message.relay_headers()
        for attribute, value in self.envelope.attributes(message).items():
            headers[f"cloudEvents:{attribute}"] = value
        routing_key = self.routing_key(message)
        if len(routing_key.encode()) > 255:
            raise PermanentFailure(
                f"routing key {routing_key[:40]!r}... is longer than AMQP's 255 bytes"
            )
        return _Outgoing(
            message_id=message.message_id,
            routing_key=routing_key,
            body=self.envelope.body(message),
            headers=headers,
        )


class _Channel:
    """One connection and its channel in confirm mode, used by one thread at a time.
    Confirms are counted by delivery tag (1, 2, ... in publish order on the channel);
    the broker may confirm many at once (``multiple``)."""

    def __init__(self, relay: AmqpRelay) -> None:
        self.relay = relay
        kombu = relay._kombu
        self.connection = _connection(relay)
        try:
            # One try per broker URL, no sleep between: the engine's back-off waits.
            tries = max(len(self.connection.alt), 1)
            self.connection.ensure_connection(max_retries=tries - 1)
            channel = self.connection.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._acked)
            channel.events["basic_nack"].add(self._nacked)
            channel.events["basic_return"].add(self._returned)
            exchange = kombu.Exchange(relay.exchange, relay.exchange_type, durable=True)
            if relay.declare:
                exchange(channel).declare()
            self.producer = kombu.Producer(channel, exchange=exchange, auto_declare=False)
        except BaseException:
            self.drop()
            raise
        self.published = 0  # the delivery tag of the last message published
        self.waiting: dict[int, uuid.UUID] = {}
        self.failed: dict[uuid.UUID, BaseException] = {}

    def publish(self, outgoing: list[_Outgoing], timeout: float) -> Failures:
        """Publish the messages, then wait for every confirm; raise if the connection
        or channel fails meanwhile, or the confirms take longer than `timeout`."""
        self.failed = {}
        content_type = self.relay.envelope.content_type
        for item in outgoing:
            self.producer.publish(
                item.body,
                routing_key=item.routing_key,
                delivery_mode=2,
                mandatory=self.relay.mandatory,
                content_type=content_type,
                content_encoding="utf-8",
                headers=item.headers,
                message_id=str(item.message_id),
                timeout=timeout,
            )
            self.published += 1
            self.waiting[self.published] = item.message_id
        deadline = time.monotonic() + timeout
        while self.waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the broker confirmed no message within {timeout:g} s")
            self.connection.drain_events(timeout=remaining)
        return self.failed

    def _confirmed(self, delivery_tag: int, multiple: bool) -> list[uuid.UUID]:
        tags = [tag for tag in self.waiting if tag <= delivery_tag] if multiple else [delivery_tag]
        return [self.waiting.pop(tag) for tag in tags if tag in self.waiting]

    def _acked(self, delivery_tag: int, multiple: bool) -> None:
        self._confirmed(delivery_tag, multiple)

    def _nacked(self, delivery_tag: int, multiple: bool) -> None:
        for message_id in self._confirmed(delivery_tag, multiple):
            self.failed[message_id] = BrokerRefused("the broker nacked the message")

    def _returned(self, error: Exception, exchange: str, routing_key: str, message: Any) -> None:
        # A returned message is still acked after; it failed all the same.
        message_id = uuid.UUID(message.properties["message_id"])
        self.failed[message_id] = BrokerRefused(
            f"the broker returned the message: {error} (exchange {exchange!r}, "
            f"routing key {routing_key!r}; is a queue bound to take it?)"
        )

    def close(self) -> None:
        """Close the connection the polite way (the broker's close handshake)."""
        with contextlib.suppress(Exception):  # already broken: nothing more to release
            self.connection.release()

    def drop(self) -> None:
        """Close the socket without the handshake, which a broken or silent broker
        would never answer."""
        with contextlib.suppress(Exception):
            self.connection.collect()


def _url_problem(url: str) -> str | None:
    """Why `url` (or one of its ``;``-separated fail-over URLs) is not a broker URL the
    relay can use, or None; it shows the URL without its credentials and query."""
    return url_problem(url, SCHEMES, "an AMQP", fail_over=True)


def _connection(relay: AmqpRelay) -> Any:
    """A kombu Connection to the relay's broker, not yet connected. A URL kombu cannot
    read raises the check's problem in place of kombu's error, which may quote the
    password (the drain records and logs the error)."""
    try:
        return relay._kombu.Connection(
            relay.url, connect_timeout=relay.connect_timeout, **relay.connection_options
        )
    except ValueError:
        problem = _url_problem(relay.url)
        if problem is None:  # not the URL's fault: an option's
            raise
        raise OutboxConfigurationError(f"Relay {relay.name!r}: {problem}") from None
