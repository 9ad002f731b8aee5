"""The webhook relay: each message POSTed to a URL with Standard Webhooks signatures.

The body is the envelope's (a CloudEvents event by default), with its content type; in
CloudEvents binary mode the event's attributes travel as ``ce-`` headers. Every request
also carries the relay headers (``outbox-message-id``, ``outbox-category``,
``outbox-shard``, ``outbox-attempt``, the writer's headers and trace context) and the
signature headers of `outbox.relays.signing`.

The answer decides what becomes of the message: a 2xx delivered it; 410 Gone dead-letters
it (the endpoint says it will never take it); 429 and 5xx retry it, after the
``Retry-After`` the server asked for when it did; any other answer, a timeout or a
connection error is an ordinary failure, retried with back-off.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.core.checks import CheckMessage

from outbox.conf import outbox_settings
from outbox.exceptions import OutboxConfigurationError, PermanentFailure
from outbox.relays.base import Failures, Message, Relay, RelayClientMissing, skip_after_failure
from outbox.relays.envelope import Envelope
from outbox.relays.http_rules import (
    WebhookError,
    ce_header_value,
    judge,
    shown_url,
    url_problem,
    writer_header_value,
)
from outbox.relays.signing import Secret, signature_headers, signing_keys

try:
    import urllib3
    from urllib3.exceptions import HTTPError, NewConnectionError
    from urllib3.exceptions import TimeoutError as Timeout
except ImportError as missing:  # the extra is not installed: said when a relay is made
    _MISSING: ImportError | None = missing
else:
    _MISSING = None

__all__ = ["WebhookError", "WebhookRelay"]

USER_AGENT = "django-outboxes webhook relay"
# Connections kept per host without a `concurrency`: more than any drain runs slots.
_UNCAPPED_POOL = 1024


class WebhookRelay(Relay):
    """POST each message to `url`, signed with `secret` (Standard Webhooks: ``whsec_``
    plus the base64 of the key; see `outbox.relays.signing` for the other forms).

    `timeout`: seconds allowed to connect, to send, and for each read of the answer.
    `envelope`: ``"cloudevents"`` (structured), ``"cloudevents-binary"``, ``"bare"`` or an
    `Envelope`. `headers`: sent with every request (an ``Authorization``, say); the
    content type, the signature and the relay's own headers take precedence.
    `concurrency`: the most requests in flight at once in this process (None: as many
    as the drain's slot threads deliver at once; `publish` of a batch then POSTs up to
    ``OUTBOX_CONCURRENCY`` shards at once). Each slot thread POSTs the message it
    delivers itself. The relay keeps one pool of connections (urllib3), shared by every
    thread that calls it: a connection per request in flight, kept for the next.
    """

    extra = "webhooks"

    def __init__(
        self,
        name: str,
        *,
        url: str,
        secret: Secret,
        timeout: float = 10.0,
        envelope: Envelope | str = "cloudevents",
        headers: Mapping[str, str] | None = None,
        concurrency: int | None = None,
    ) -> None:
        if _MISSING is not None:
            raise RelayClientMissing(
                "WebhookRelay needs urllib3, which is not installed: "
                f'pip install "django-outboxes[{self.extra}]"'
            ) from _MISSING
        super().__init__(name, envelope=envelope)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise OutboxConfigurationError(
                f"Relay {name!r}: concurrency must be a whole number of 1 or more (or None "
                f"for no cap of its own), not {concurrency!r}."
            )
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._concurrency = concurrency
        self._keys: list[bytes] = []
        self._problems = self._configuration_problems(secret)
        self._target = "" if self._problems else shown_url(url)
        self._lock = threading.Lock()
        self._http: urllib3.PoolManager | None = None
        self._http_pid = 0
        self._in_flight = threading.BoundedSemaphore(self.concurrency) if concurrency else None

    @property
    def concurrency(self) -> int:
        return self._concurrency or outbox_settings.CONCURRENCY

    # -- configuration ------------------------------------------------------------------

    def _configuration_problems(self, secret: Secret) -> list[str]:
        problems = []
        try:
            self._keys = signing_keys(secret)
        except ValueError as error:
            problems.append(f"the signing secret does not decode: {error}.")
        problem = url_problem(self.url)
        if problem:
            problems.append(problem)
        for name, value in self.headers.items():
            try:
                writer_header_value(name, value)
            except (PermanentFailure, TypeError):
                problems.append(f"header {name!r} cannot be sent over HTTP.")
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, (int, float))
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            problems.append(f"timeout must be a number of seconds above 0, not {self.timeout!r}.")
        return problems

    def check(self) -> list[CheckMessage]:
        return [self.error(problem) for problem in self._problems]

    # -- publishing ---------------------------------------------------------------------

    def __call__(self, signal: Any = None, sender: Any = None, **kwargs: Any) -> None:
        """One request per message, sent by the thread that delivers it (a slot of the
        drain): joining the calls of several slots into one publish would only hand
        their requests to other threads."""
        self._send(Message.from_receiver(sender, kwargs))

    def publish(self, messages: Sequence[Message]) -> Failures:
        """POST the messages, different shards at once (up to `concurrency` requests in
        flight), each shard's one at a time and in order, none after its first failure."""
        shards: dict[str, list[Message]] = {}
        for message in messages:
            shards.setdefault(message.shard_key, []).append(message)
        workers = min(self.concurrency, len(shards))
        if workers <= 1:
            return skip_after_failure(messages, self._send)
        failed: dict[uuid.UUID, BaseException] = {}
        with ThreadPoolExecutor(workers, thread_name_prefix=f"outbox-{self.name}") as pool:
            for shard_failures in pool.map(self._send_shard, shards.values()):
                failed.update(shard_failures)
        return failed

    def _send_shard(self, messages: list[Message]) -> Failures:
        return skip_after_failure(messages, self._send)

    def _send(self, message: Message) -> None:
        with self._in_flight or contextlib.nullcontext():
            self._post(message)

    def _post(self, message: Message) -> None:
        if self._problems:
            raise OutboxConfigurationError(f"Relay {self.name!r}: {self._problems[0]}")
        body = self.envelope.body(message)
        headers = self._request_headers(message, body)
        try:
            # A bytes value (UTF-8 text, `_utf8`) goes out as it is: typed str only.
            response = self._client().request(
                "POST",
                self.url,
                body=body,
                headers=headers,  # type: ignore[arg-type]
                retries=False,
                redirect=False,
            )
        except NewConnectionError as error:  # refused, unreachable (a Timeout subclass)
            raise WebhookError(
                f"Relay {self.name!r}: POST {self._target} failed to connect: {error}"
            ) from error
        except Timeout as error:
            raise WebhookError(
                f"Relay {self.name!r}: POST {self._target} timed out after "
                f"{self.timeout:g} s ({type(error).__name__})."
            ) from error
        except HTTPError as error:  # the connection dropped, a malformed answer
            raise WebhookError(
                f"Relay {self.name!r}: POST {self._target} failed: {type(error).__name__}: {error}"
            ) from error
        judge(
            response.status,
            response.reason or "",
            response.data.decode("utf-8", "replace"),
            response.headers.get("retry-after"),
            f"Relay {self.name!r}: POST {self._target}",
        )

    def _request_headers(self, message: Message, body: bytes) -> dict[str, str | bytes]:
        """The request's headers, by lower-case name (a later one replaces an earlier
        one); text beyond ASCII is sent as UTF-8."""
        headers: dict[str, str | bytes] = {"user-agent": USER_AGENT}
        for name, value in self.headers.items():
            headers[name.lower()] = _utf8(value.strip(" \t"))
        for name, value in message.relay_headers().items():
            headers[name.lower()] = _utf8(writer_header_value(name, value))
        for name, value in self.envelope.attributes(message).items():
            headers[f"ce-{name}"] = ce_header_value(value)
        headers["content-type"] = self.envelope.content_type
        sent_at = int(time.time())
        headers.update(signature_headers(self._keys, str(message.message_id), sent_at, body))
        return headers

    def _client(self) -> urllib3.PoolManager:
        """The relay's pool of connections, made on first use; a forked process makes its
        own, never sharing its parent's connections."""
        client = self._http
        if client is not None and self._http_pid == os.getpid():
            return client
        with self._lock:
            if self._http is None or self._http_pid != os.getpid():
                # Keeps a connection per request in flight (the engine's slot threads
                # calling at once), made as needed and kept for the next request; past
                # `maxsize`, urllib3 would close the extra ones after use, with a warning.
                self._http = urllib3.PoolManager(
                    maxsize=self._concurrency or _UNCAPPED_POOL,
                    block=False,
                    timeout=urllib3.Timeout(connect=self.timeout, read=self.timeout),
                )
                self._http_pid = os.getpid()
            return self._http

    def close(self) -> None:
        with self._lock:
            client, self._http = self._http, None
            if client is not None and self._http_pid == os.getpid():
                client.clear()


def _utf8(value: str) -> str | bytes:
    """A header value as sent: HTTP's own encoding would be Latin-1, so text beyond
    ASCII goes as its UTF-8 bytes, which is what a server reading UTF-8 expects."""
    return value if value.isascii() else value.encode()
