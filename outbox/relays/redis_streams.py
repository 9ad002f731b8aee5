"""RedisStreamRelay: each message appended to a Redis stream (``XADD``) through redis-py::

    RedisStreamRelay("events", url="redis://cache:6379/2", stream="app.{category}",
                     maxlen=100_000).connect(Scope.ORGANIZATION)

An entry's fields: ``outbox-message-id``, ``outbox-category``, ``outbox-shard``,
``outbox-attempt`` and the writer's headers (``traceparent``, ``tracestate`` ...), as
`Message.relay_headers` gives them; with a binary CloudEvents envelope its attributes as
``ce_id``, ``ce_type``, ``ce_source`` ... (the prefix of the CloudEvents Kafka binding:
Redis has none); then ``content-type`` and ``body`` (the envelope's). A writer's header
never replaces ``content-type`` or ``body``.

A batch's ``XADD`` commands go in one pipeline (no MULTI: an entry that fails, say on a
key that holds no stream, fails alone). The entry's id is Redis's own (``*``). With
`maxlen` each ``XADD`` caps its stream, ``MAXLEN ~`` (Redis trims whole nodes, at
least `maxlen` entries stay) unless `approximate` is False: entries trimmed are gone,
read or not.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.core.checks import CheckMessage

from outbox.exceptions import OutboxConfigurationError
from outbox.relays.base import Failures, Message, Relay, client_library, whole_number
from outbox.relays.broker_urls import shown_url, url_problem
from outbox.relays.destination import Destination
from outbox.relays.envelope import Envelope
from outbox.relays.waves import publish_in_waves

__all__ = ["RedisStreamRelay"]

SCHEMES = ("redis", "rediss", "unix")


class RedisStreamRelay(Relay):
    """Append to `stream`, a template of the message's fields or a callable
    (`outbox.relays.destination`; default ``outbox.{category}``, the category's name in
    lower case). The client is thread-safe (a pool of connections); a connection lost
    fails the batch, the next call connects again. redis-py retries a command once, at
    once, on a new connection (a pooled one the server closed); beyond that the
    engine's back-off applies. `socket_timeout`: how long a batch waits for Redis."""

    extra = "redis"

    def __init__(
        self,
        name: str,
        *,
        url: str = "redis://127.0.0.1:6379/0",
        stream: str | Callable[[Message], str] = "outbox.{category}",
        maxlen: int | None = None,
        approximate: bool = True,
        envelope: Envelope | str = "cloudevents",
        socket_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self._redis = client_library("redis", "RedisStreamRelay", "redis-py", "redis")
        super().__init__(name, envelope=envelope)
        whole_number(name, "maxlen", maxlen, "no cap")
        self.url = url
        self.stream = Destination(stream, "stream")
        self.maxlen = maxlen
        self.approximate = approximate
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self._client: Any = None
        self._lock = threading.Lock()

    def publish(self, messages: Sequence[Message]) -> Failures:
        return publish_in_waves(messages, self._publish_wave)

    def check(self) -> list[CheckMessage]:
        found: list[CheckMessage] = [self.error(problem) for problem in self.stream.problems()]
        problem = self._url_problem()
        if problem:
            found.append(self.error(problem))
        return found

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def fields(self, message: Message) -> dict[str, str | bytes]:
        """The stream entry's fields for one message."""
        fields: dict[str, str | bytes] = dict(message.relay_headers())
        for attribute, value in self.envelope.attributes(message).items():
            fields[f"ce_{attribute}"] = value
        fields["content-type"] = self.envelope.content_type
        fields["body"] = self.envelope.body(message)
        return fields

    def _publish_wave(self, wave: list[Message]) -> Failures:
        failed: dict[uuid.UUID, BaseException] = {}
        sent = []
        with self._redis_client().pipeline(transaction=False) as pipeline:
            for message in wave:
                try:
                    stream, fields = self.stream(message), self.fields(message)
                except Exception as error:  # a stream name or body that cannot be made
                    failed[message.message_id] = error
                    continue
                pipeline.xadd(stream, fields, maxlen=self.maxlen, approximate=self.approximate)
                sent.append(message)
            # A lost connection raises here, failing the whole wave.
            replies = pipeline.execute(raise_on_error=False) if sent else []
        for message, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                failed[message.message_id] = reply
        return failed

    def _redis_client(self) -> Any:
        """The relay's client, made on first use (it connects as commands need)."""
        with self._lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> Any:
        """A client for the URL. One redis-py cannot read raises the check's problem in
        place of redis-py's error, which may quote the password (the drain records and
        logs the error)."""
        retry = importlib.import_module("redis.retry")
        backoff = importlib.import_module("redis.backoff")
        try:
            return self._redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.connect_timeout,
                retry=retry.Retry(backoff.NoBackoff(), 1),
            )
        except ValueError:
            problem = self._url_problem()
            if problem is None:  # not the URL's fault
                raise
            raise OutboxConfigurationError(f"Relay {self.name!r}: {problem}") from None

    def _url_problem(self) -> str | None:
        """Why the URL is not one redis-py can use, or None; it shows the URL without
        its credentials and query, and quotes none of redis-py's errors."""
        problem = url_problem(self.url, SCHEMES, "a Redis")
        if problem is not None:
            return problem
        try:
            self._redis.connection.parse_url(self.url)
        except (ValueError, TypeError):
            return (
                f"url {shown_url(self.url)!r} is not a Redis URL redis-py can read: its "
                "scheme must be in lower case, and each query argument redis-py knows "
                "(db, socket_timeout ...) must have a value of its type (the query is not "
                "shown: it may hold secrets)."
            )
        return None
