"""The webhook relay: each message POSTed to a URL with Standard Webhooks signatures.

The body is the envelope's (a CloudEvents event by default), with its content type; in
CloudEvents binary mode the event's attributes travel as ``ce-`` headers. Every request
also carries the relay headers (``outbox-message-id``, ``outbox-category``,
``outbox-shard``, ``outbox-attempt``, the writer's headers and trace context) and the
signature headers of `outbox.relays.signing`. The relay's own headers win over a
writer's of the same name, so no message can change the request's credentials, framing
or identity.

The answer decides what becomes of the message: a 2xx delivered it; 410 Gone dead-letters
it (the endpoint says it will never take it); 429 and 5xx retry it, after the
``Retry-After`` the server asked for when it did; any other answer, a timeout or a
connection error is an ordinary failure, retried with back-off; a message whose headers
HTTP cannot carry at all is a dead letter. Only the start of an answer is read (what its
error shows), and the whole request, answer included, has `timeout` seconds.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from django.core.checks import CheckMessage

from outbox.conf import outbox_settings
from outbox.exceptions import OutboxConfigurationError, PermanentFailure
from outbox.headers import RELAY_PREFIX
from outbox.relays.base import (
    Failures,
    Message,
    Relay,
    RelayClientMissing,
    skip_after_failure,
    whole_number,
)
from outbox.relays.envelope import Envelope
from outbox.relays.http_rules import (
    WebhookError,
    ce_header_value,
    header_problem,
    judge,
    shown_url,
    url_problem,
)
from outbox.relays.signing import Secret, signature_headers, signing_keys

try:
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
    from urllib3.exceptions import HTTPError, NewConnectionError
    from urllib3.exceptions import TimeoutError as Timeout
except ImportError as missing:  # the extra is not installed: said when a relay is made
    _MISSING: ImportError | None = missing
else:
    _MISSING = None

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["WebhookError", "WebhookRelay"]

USER_AGENT = "django-outboxes webhook relay"
# Connections kept per host without a `concurrency`: more than any drain runs slots.
_UNCAPPED_POOL = 1024
# The most of an answer's body the relay reads: the start its error shows (and the dead
# letter's); the rest is not worth holding in memory or waiting for.
ANSWER_BYTES = 4096


class WebhookRelay(Relay):
    """POST each message to `url`, signed with `secret` (Standard Webhooks: ``whsec_``
    plus the base64 of the key; see `outbox.relays.signing` for the other forms).

    `timeout`: seconds allowed for the whole request: connecting, sending and reading
    the answer. `envelope`: ``"cloudevents"`` (structured), ``"cloudevents-binary"``,
    ``"bare"`` or an `Envelope`. `headers`: sent with every request (an
    ``Authorization``, say), in place of a writer's of the same name; the content type,
    the signature and the ``outbox-*`` headers take precedence. They may not frame or
    route the request (``content-length``, ``host``...): `check` reports those.
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
        whole_number(name, "concurrency", concurrency, "no cap of its own")
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
            problems.append(f"the signing {error}.")
        problem = url_problem(self.url)
        if problem:
            problems.append(problem)
        for name, value in self.headers.items():
            problem = header_problem(name, value)
            if problem:
                problems.append(problem)
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
        request = f"Relay {self.name!r}: POST {self._target}"
        try:
            response = self._request(body, self._request_headers(message, body), request)
            answer = _start_of_answer(response)
        except NewConnectionError as error:  # refused, unreachable (a Timeout subclass)
            raise WebhookError(f"{request} failed to connect: {error}") from error
        except Timeout as error:
            raise WebhookError(
                f"{request} timed out after {self.timeout:g} s ({type(error).__name__})."
            ) from error
        except HTTPError as error:  # the connection dropped, a malformed answer
            raise WebhookError(f"{request} failed: {type(error).__name__}: {error}") from error
        judge(
            response.status,
            response.reason or "",
            answer,
            response.headers.get("retry-after"),
            request,
        )

    def _request(
        self, body: bytes, headers: dict[str, str | bytes], request: str
    ) -> urllib3.BaseHTTPResponse:
        """Send the request; its answer is left to read. A header the client refuses to
        send (a row written before the header rules may hold one) refuses it the same
        way on every attempt: `PermanentFailure`."""
        try:
            # A bytes value (UTF-8 text, `_utf8`) goes out as it is: typed str only.
            return self._client().request(
                "POST",
                self.url,
                body=body,
                headers=headers,  # type: ignore[arg-type]
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except HTTPError:
            raise  # urllib3's own errors, some of them ValueErrors too
        except ValueError as error:  # http.client: "Invalid header name/value..."
            raise PermanentFailure(f"{request} cannot be sent: {error}") from error

    def _request_headers(self, message: Message, body: bytes) -> dict[str, str | bytes]:
        """The request's headers, by lower-case name; text beyond ASCII is sent as UTF-8.
        The writer's come first (those `Message.relay_headers` lets through); the
        relay's own replace any of the same name: its user agent, its configured
        `headers` (which may give another user agent; a writer's ``authorization``,
        where allowed, goes out only if they have none), the ``outbox-*`` headers, the
        ``ce-`` headers, the content type and the signature."""
        relay_headers = message.relay_headers()
        headers: dict[str, str | bytes] = {
            name.lower(): _utf8(value.strip(" \t"))
            for name, value in relay_headers.items()
            if not name.startswith(RELAY_PREFIX)
        }
        headers["user-agent"] = USER_AGENT
        for name, value in self.headers.items():
            headers[name.lower()] = _utf8(value.strip(" \t"))
        for name, value in relay_headers.items():
            if name.startswith(RELAY_PREFIX):
                headers[name] = _utf8(value)
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
                    timeout=urllib3.Timeout(total=self.timeout),
                )
                self._http.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
                self._http_pid = os.getpid()
            return self._http

    def close(self) -> None:
        with self._lock:
            client, self._http = self._http, None
            if client is not None and self._http_pid == os.getpid():
                client.clear()


def _start_of_answer(response: urllib3.BaseHTTPResponse) -> str:
    """The first `ANSWER_BYTES` of the answer's body, as text. A connection whose answer
    was not read to its end goes back to the pool closed (it reconnects when next
    used): reused as it is, its next request would read the rest as its own answer."""
    try:
        # Not decoded, so a compressed answer (never asked for) cannot grow in memory.
        start = response.read(ANSWER_BYTES, decode_content=False)
    finally:
        if response.connection is not None:  # urllib3 releases it once read to its end
            response.close()
            response.release_conn()
    return start.decode("utf-8", "replace")


class _DeadlineReader(io.RawIOBase):
    """Reads a socket until a deadline: the socket's timeout when the reader is made.
    Each read waits at most for what is left of it, so a server sending a byte at a
    time is cut off when the time is up, not after a timeout per byte."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        timeout = sock.gettimeout()
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._sock.fileno()

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")  # socket.timeout, as a read past it raises
            self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _AnswerWithinDeadline(http.client.HTTPResponse):
    """An answer read, head and body, within one deadline: what is left of the request's
    `Timeout.total` when the answer is awaited (urllib3 sets the socket's timeout to it
    just before)."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # the reader made for the socket, with a timeout per read
        self.fp = io.BufferedReader(_DeadlineReader(sock))


if _MISSING is None:
    # urllib3's pools, their connections reading answers within the deadline (errors
    # name the connection class: "WebhookConnection(host=..., port=...)").

    class WebhookConnection(HTTPConnection):
        response_class = _AnswerWithinDeadline

    class WebhookTLSConnection(HTTPSConnection):
        response_class = _AnswerWithinDeadline

    class _Pool(HTTPConnectionPool):
        ConnectionCls = WebhookConnection

    class _TLSPool(HTTPSConnectionPool):
        ConnectionCls = WebhookTLSConnection


def _utf8(value: str) -> str | bytes:
    """A header value as sent: HTTP's own encoding would be Latin-1, so text beyond
    ASCII goes as its UTF-8 bytes, which is what a server reading UTF-8 expects."""
    return value if value.isascii() else value.encode()
