"""The webhook relay against hostile input and hostile servers (security review, issue 49),
on the wire of a raw HTTP/1.1 server that reads exactly the bytes that arrive:

- the relay's own headers (credentials, host, user agent, message id, framing) win over
  a writer's, whatever a row written before the header rule holds;
- a header HTTP cannot carry is refused when configured, and dead-letters the message
  it is in rather than being retried for ever;
- an answer is read only as far as its error excerpt needs, within one deadline for the
  whole request;
- a signing secret is long enough, and receivers know the timestamp tolerance."""

import base64
import contextlib
import json
import os
import re
import socket
import threading
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings
from standardwebhooks import Webhook, WebhookVerificationError
from urllib3.util import SKIP_HEADER

from outbox import PermanentFailure, outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import InvalidOutboxMessage
from outbox.models import RegionOutbox
from outbox.relays import WebhookRelay
from outbox.relays.http_rules import WebhookError
from outbox.relays.signing import signature_headers, signing_keys
from outbox.relays.webhooks import USER_AGENT
from tests.conftest import committing
from tests.relay_helpers import message
from tests.testapp.categories import Category, Scope

HOWTO = Path(__file__).resolve().parent.parent / "docs" / "howto" / "relays.md"
_REQUEST_LINE = re.compile(r"[A-Z]+ /\S* HTTP/1\.[01]")


def new_secret():
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@dataclass
class Request:
    """One request as the server parsed it: the connection it came on (0, 1...), its
    request line, its header fields as sent (names in lower case) and its body."""

    connection: int
    line: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name):
        """The value of the header `name`, which the request must carry exactly once."""
        (value,) = [value for field, value in self.headers if field == name]
        return value

    @property
    def well_formed(self):
        return bool(_REQUEST_LINE.fullmatch(self.line))


def answer_ok(sock, request):
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


class RawHttpServer:
    """A plain HTTP/1.1 server on a socket, a thread per connection, keeping connections
    open. It reads the bytes that arrive, splits off each request's head itself and reads
    its body by its Content-Length, records it, then calls `answer(sock, request)` to
    write the answer. A request whose line does not parse (the rest of a body sent with a
    short Content-Length, say) is recorded too and answered 501, as http.server does."""

    def __init__(self):
        self.requests: list[Request] = []
        self.answer = answer_ok
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        for number in range(1_000_000):
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock, number):
        pending = b""
        with sock, contextlib.suppress(OSError):  # the client went away (a reset, say)
            while True:
                request, pending = self._read_request(sock, pending, number)
                if request is None:
                    return  # the client closed the connection
                self.requests.append(request)
                if not request.well_formed:
                    sock.sendall(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n")
                else:
                    self.answer(sock, request)

    @staticmethod
    def _read_request(sock, pending, number):
        while b"\r\n\r\n" not in pending:
            chunk = sock.recv(65536)
            if not chunk:
                return None, b""
            pending += chunk
        head, pending = pending.split(b"\r\n\r\n", 1)
        line, *fields = head.decode("latin-1").split("\r\n")
        headers = [
            (name.strip().lower(), value.strip())
            for name, _, value in (field.partition(":") for field in fields)
        ]
        lengths = [value for name, value in headers if name == "content-length"]
        length = int(lengths[0]) if len(lengths) == 1 and lengths[0].isdigit() else 0
        while len(pending) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return None, b""
            pending += chunk
        return Request(number, line, headers, pending[:length]), pending[length:]

    def close(self):
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def raw_server():
    running = RawHttpServer()
    yield running
    running.close()


@pytest.fixture
def make_relay(raw_server):
    made = []

    def make(connect=False, **options):
        options = {"url": raw_server.url, "secret": new_secret(), **options}
        relay = WebhookRelay(f"hook-{uuid.uuid4().hex[:12]}", **options)
        if connect:
            relay.connect(Category.AUDIT_EVENT)
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.disconnect()
        relay.close()


# -- the relay's headers win over a writer's ----------------------------------------------

# What a row written before the header rule may hold: each would, as sent, take over the
# relay's credentials, the request's routing and framing, or the message's identity.
FORGED = {
    "authorization": "Bearer writer-token",
    "host": "evil.example",
    "user-agent": "writer-agent",
    "outbox-message-id": "forged",
    "content-length": "2",
    "x-tenant": "acme",
}


def write_forged_rows(shards):
    """A valid row in each shard, then its headers set to FORGED, bypassing the checks
    of the write path (as a row written before the header rule)."""
    with outbox_context(transaction.atomic(), flush=False):
        rows = [
            RegionOutbox.objects.create(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=shard,
                category=Category.AUDIT_EVENT,
                object_identifier=shard,
                payload={"shard": shard, "text": "x" * 100},
                headers={"x-tenant": "acme"},
            )
            for shard in shards
        ]
    for row in rows:
        RegionOutbox.objects.filter(pk=row.pk).update(headers=FORGED)
    return {str(row.message_id): row for row in rows}


@committing
@override_settings(OUTBOX_WRITER_HEADERS_ALLOWED=["authorization"])
def test_the_relays_own_headers_win_over_a_writers_on_the_wire(raw_server, make_relay):
    make_relay(connect=True, concurrency=1, headers={"Authorization": "Bearer relay-token"})
    rows = write_forged_rows(shards=[1, 2])
    stats = drain_outboxes()
    assert (stats.failures, stats.dead_lettered) == (0, 0)
    assert not RegionOutbox.objects.exists()
    requests = raw_server.requests
    assert [request.well_formed for request in requests] == [True, True]
    assert {request.connection for request in requests} == {0}  # one pooled connection
    for request in requests:
        names = [name for name, _ in request.headers]
        assert len(names) == len(set(names)), names  # each header sent once
        assert request.header("authorization") == "Bearer relay-token"
        assert request.header("host") == f"127.0.0.1:{raw_server.port}"
        assert request.header("user-agent") == USER_AGENT
        row = rows[request.header("webhook-id")]
        assert request.header("outbox-message-id") == str(row.message_id)
        assert request.header("content-length") == str(len(request.body))
        assert json.loads(request.body)["data"] == row.payload  # the whole body
        assert request.header("x-tenant") == "acme"


@override_settings(OUTBOX_WRITER_HEADERS_ALLOWED=["authorization"])
def test_a_writers_allowed_authorization_goes_out_when_the_relay_has_none(raw_server, make_relay):
    relay = make_relay()
    assert relay.publish([message(headers={"Authorization": "Bearer writer-token"})]) == {}
    (request,) = raw_server.requests
    assert request.header("authorization") == "Bearer writer-token"


def test_a_configured_user_agent_replaces_the_relays_and_the_writers(raw_server, make_relay):
    relay = make_relay(headers={"User-Agent": "billing-sync/2"})
    assert relay.publish([message(headers={"user-agent": "writer-agent"})]) == {}
    (request,) = raw_server.requests
    assert request.header("user-agent") == "billing-sync/2"


@committing
@pytest.mark.parametrize(
    "name", ["authorization", "Host", "content-length", "outbox-message-id", "x-a\n"]
)
def test_a_header_a_writer_may_not_set_is_refused_when_written(name):
    with outbox_context(transaction.atomic(), flush=False):
        row = RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=1,
            category=Category.AUDIT_EVENT,
            object_identifier=1,
            payload={},
            headers={name: "2"},
        )
        with pytest.raises(InvalidOutboxMessage, match=re.escape(repr(name))):
            row.save()
    assert not RegionOutbox.objects.exists()


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Length": "2"},
        {"transfer-encoding": "chunked"},
        {"Host": "other.example"},
        {"connection": "close"},
        {"te": "trailers"},
        {"upgrade": "h2c"},
        {"expect": "100-continue"},
        {"keep-alive": "timeout=5"},
        {"trailer": "x-sum"},
        {"x-a\n": "v"},  # `$` in a pattern lets a trailing newline through
        {"x-a": "v\r\nx-b: w"},
    ],
    ids=lambda headers: repr(next(iter(headers.items()))),
)
def test_check_reports_configured_headers_the_relay_cannot_send(make_relay, headers):
    relay = make_relay(headers=headers)
    (error,) = relay.check()
    assert error.id == "outbox.E023"
    assert repr(next(iter(headers))) in error.msg


def test_configured_credentials_and_custom_headers_pass_the_check(make_relay):
    headers = {"Authorization": "Bearer t", "Proxy-Authorization": "Basic x", "x-env": "prod"}
    assert make_relay(headers=headers).check() == []


@pytest.mark.parametrize(
    "fields",
    [
        # A region name with a newline (written before the rule), in outbox-shard.
        pytest.param({"region_name": "eu\nx"}, id="newline"),
        # urllib3's marker for "do not send this header", which it refuses elsewhere.
        pytest.param({"headers": {"x-tenant": SKIP_HEADER}}, id="skip-header"),
    ],
)
def test_a_header_the_client_refuses_dead_letters_the_message(raw_server, make_relay, fields):
    # The client refuses it with a plain ValueError, the same on every attempt.
    relay = make_relay()
    broken = message(**fields)
    failure = relay.publish([broken])[broken.message_id]
    assert isinstance(failure, PermanentFailure) and "cannot be sent" in str(failure)
    assert raw_server.requests == []
    assert relay.publish([message()]) == {}  # the relay goes on


# -- the answer: read as far as needed, within one deadline -------------------------------

HUGE = 64 * 1024 * 1024


def test_a_huge_answer_is_not_read_into_memory(raw_server, make_relay):
    sent = []

    def stream_64_mb(sock, request):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
        chunk = b"x" * 65536
        for _ in range(HUGE // len(chunk)):
            sock.sendall(chunk)
            sent.append(len(chunk))

    raw_server.answer = stream_64_mb
    relay = make_relay()
    tracemalloc.start()
    try:
        assert relay.publish([message()]) == {}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, f"{peak / 2**20:.1f} MiB"
    assert sum(sent) < HUGE / 2  # the relay stopped reading early
    # The connection was not pooled with the rest of the answer unread: the next request
    # goes out on a new one, and its answer is its own.
    raw_server.answer = answer_ok
    assert relay.publish([message()]) == {}
    assert [request.connection for request in raw_server.requests] == [0, 1]


def drip(head, body):
    """An answer that sends `head` at once, then `body` a byte every half second."""

    def answer(sock, request):
        sock.sendall(head)
        for byte in body:
            time.sleep(0.5)
            sock.sendall(bytes([byte]))

    return answer


@committing
@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(drip(b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), id="head"),
        pytest.param(drip(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", b"x" * 12), id="body"),
    ],
)
def test_a_dripping_server_is_cut_off_at_the_timeout(raw_server, make_relay, answer):
    raw_server.answer = answer
    make_relay(connect=True, timeout=1)
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutbox.objects.create(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=1,
            category=Category.AUDIT_EVENT,
            object_identifier=1,
            payload={},
        )
    started = time.monotonic()
    stats = drain_outboxes()
    assert time.monotonic() - started < 2.0  # the whole request, not each read
    assert (stats.failures, stats.dead_lettered) == (1, 0)
    row = RegionOutbox.objects.get()  # failed, to be retried: not delivered
    assert row.attempts == 1 and row.dead_at is None
    assert "timed out after 1 s" in row.last_error


def test_the_error_excerpt_still_shows_the_start_of_the_answer(raw_server, make_relay):
    def bad_request(sock, request):
        body = b"field 'n' is missing " + b"." * 10_000
        sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body))
        sock.sendall(body)

    raw_server.answer = bad_request
    relay = make_relay()
    sent = message()
    failure = relay.publish([sent])[sent.message_id]
    assert isinstance(failure, WebhookError) and failure.status == 400
    assert "field 'n' is missing" in str(failure)


# -- secrets and signatures -----------------------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    [
        b"k",
        os.urandom(23),
        "whsec_" + base64.b64encode(b"short").decode(),
        [new_secret(), base64.b64encode(b"k" * 16).decode()],  # rotating to a short one
    ],
    ids=["1-byte", "23-bytes", "whsec-5-bytes", "rotation"],
)
def test_a_signing_key_under_24_bytes_is_refused(make_relay, secret):
    (error,) = make_relay(secret=secret).check()
    assert "at least 24 bytes" in error.msg
    with pytest.raises(ValueError, match="at least 24 bytes"):
        signing_keys(secret)


def test_a_24_byte_key_is_accepted(make_relay):
    key = os.urandom(24)
    assert signing_keys(key) == [key]
    assert make_relay(secret="whsec_" + base64.b64encode(key).decode()).check() == []


def webhook_section():
    text = HOWTO.read_text()
    return text[text.index("## Webhooks") : text.index("## RabbitMQ")]


@pytest.mark.parametrize(
    ("age", "accepted"), [(-240, True), (240, True), (-360, False), (360, False)]
)
def test_receivers_hold_the_timestamp_to_the_documented_tolerance(age, accepted):
    # The how-to tells receivers to verify with a Standard Webhooks library and states
    # its tolerance on webhook-timestamp; the reference library applies it.
    assert "5 minutes" in webhook_section()
    secret = new_secret()
    body = b'{"n": 1}'
    sent_at = int(time.time()) + age
    headers = signature_headers(signing_keys(secret), str(uuid.uuid4()), sent_at, body)
    if accepted:
        Webhook(secret).verify(body, headers)
    else:
        with pytest.raises(WebhookVerificationError, match="too"):
            Webhook(secret).verify(body, headers)
