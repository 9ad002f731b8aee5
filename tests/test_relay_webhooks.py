"""The webhook relay against a real HTTP server the test starts: each message POSTed,
signed as Standard Webhooks and enveloped as a CloudEvent (the consumers' own libraries
verify and parse it), in order per shard; the server's answer decides the row's fate
(429/5xx retried, after Retry-After when given; 410 dead-lettered; too slow: failed);
a batch publishes its shards at once, each shard's messages in order."""

import base64
import contextlib
import importlib
import itertools
import json
import os
import sys
import threading
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from django.core.checks import run_checks
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone as django_timezone
from standardwebhooks import Webhook

from outbox import PermanentFailure, RetryLater, outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.models import RegionOutbox, ShardLease
from outbox.relays import Message, WebhookRelay
from outbox.relays.http_rules import WebhookError, retry_after
from tests.conftest import committing
from tests.testapp.categories import Category, Scope


def new_secret():
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Received:
    def __init__(self, path, headers, body, started):
        self.path = path
        self.headers = headers  # names in lower case
        self.body = body
        self.started = started
        self.ended = started

    def event(self):
        return from_http_event(HTTPMessage(headers=self.headers, body=self.body))

    @property
    def shard(self):
        return self.headers["outbox-shard"]


class Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a batch opens many connections at once


class WebhookServer:
    """A threaded HTTP server on 127.0.0.1 that records each request and answers with
    `answer(received)`: (status, headers, body, seconds to wait first)."""

    def __init__(self):
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.answer = lambda received: (200, {}, b"ok", 0.0)
        self.in_flight = self.most_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the relay's pool reuses connections
            disable_nagle_algorithm = True  # the body is not held back behind the headers

            def do_POST(self):
                started = time.monotonic()
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {name.lower(): value for name, value in self.headers.items()}
                received = Received(self.path, headers, body, started)
                server.enter()
                try:
                    status, extra, content, wait = server.answer(received)
                    time.sleep(wait)
                finally:
                    server.leave(received)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args):
                pass

        self.httpd = Listener(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hooks/outbox"

    def enter(self):
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def leave(self, received):
        with self.lock:
            self.in_flight -= 1
            received.ended = time.monotonic()
            self.received.append(received)

    def by_shard(self):
        shards = defaultdict(list)
        for received in sorted(self.received, key=lambda r: r.started):
            shards[received.shard].append(received)
        return shards

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    running = WebhookServer()
    yield running
    running.close()


@pytest.fixture
def make_relay(server):
    made = []

    def make(connect=True, **options):
        options = {"url": server.url, "secret": new_secret(), **options}
        relay = WebhookRelay(f"hook-{uuid.uuid4().hex[:12]}", **options)
        if connect:
            relay.connect(Category.AUDIT_EVENT)
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.disconnect()


def write(shards, per_shard, **fields):
    """Rows written in one transaction, left for the drain: for each shard, messages
    numbered 0..per_shard-1 in the order written. Returns them by message id."""
    rows = {}
    with outbox_context(transaction.atomic(), flush=False):
        for n in range(per_shard):
            for shard in range(shards):
                row = RegionOutbox(
                    shard_scope=Scope.ORGANIZATION,
                    shard_identifier=shard,
                    category=Category.AUDIT_EVENT,
                    object_identifier=shard * 1000 + n,
                    payload={"shard": shard, "n": n},
                    **fields,
                )
                row.save()
                rows[str(row.message_id)] = row
    return rows


def make_due():
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.update(scheduled_for=Now())


# -- through the engine ------------------------------------------------------------------


@committing
def test_messages_arrive_signed_as_cloudevents_in_order_per_shard(server, make_relay):
    secret = new_secret()
    make_relay(secret=secret)
    rows = write(shards=4, per_shard=3)
    stats = drain_outboxes(concurrency=4)  # slot threads share the relay's client
    assert stats.failures == 0 and not RegionOutbox.objects.exists()
    assert len(server.received) == 12 and {r.path for r in server.received} == {"/hooks/outbox"}
    for received in server.received:
        # The consumer's Standard Webhooks library accepts the signature.
        Webhook(secret).verify(received.body, received.headers)
        row = rows[received.headers["webhook-id"]]
        event = received.event()
        assert received.headers["content-type"] == "application/cloudevents+json"
        assert event.get_id() == str(row.message_id)
        assert event.get_type() == "audit_event"
        assert event.get_source() == "/outbox/organization"
        assert event.get_subject() == str(row.object_identifier)
        assert abs(event.get_time() - row.date_added) < timedelta(seconds=5)
        assert event.get_data() == row.payload
        assert received.headers["outbox-message-id"] == str(row.message_id)
        assert received.headers["outbox-category"] == "AUDIT_EVENT"
        assert received.headers["outbox-shard"] == f"ORGANIZATION:{row.shard_identifier}"
        assert received.headers["outbox-attempt"] == "1"
    shards = server.by_shard()
    assert len(shards) == 4
    for shard in shards.values():
        assert [json.loads(r.body)["data"]["n"] for r in shard] == [0, 1, 2]


@committing
def test_binary_mode_sends_the_attributes_as_ce_headers(server, make_relay):
    secret = new_secret()
    make_relay(
        secret=secret, envelope="cloudevents-binary", headers={"Authorization": "Bearer t0k"}
    )
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    rows = write(shards=1, per_shard=1, headers={"traceparent": trace, "x-tenant": "Zürich"})
    drain_outboxes()
    (received,) = server.received
    (row,) = rows.values()
    Webhook(secret).verify(received.body, received.headers)
    assert received.headers["content-type"] == "application/json"
    assert json.loads(received.body) == row.payload  # the payload alone
    assert received.headers["ce-id"] == str(row.message_id)
    assert received.headers["ce-specversion"] == "1.0"
    assert received.headers["ce-traceparent"] == received.headers["traceparent"] == trace
    assert received.headers["authorization"] == "Bearer t0k"
    assert received.headers["x-tenant"].encode("latin-1").decode() == "Zürich"  # UTF-8
    event = received.event()
    assert (event.get_id(), event.get_type(), event.get_subject()) == (
        str(row.message_id),
        "audit_event",
        str(row.object_identifier),
    )
    assert event.get_source() == "/outbox/organization"
    assert abs(event.get_time() - row.date_added) < timedelta(seconds=5)


@committing
@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_429_with_retry_after_reschedules_the_row_by_that_delay(server, make_relay, form):
    make_relay()
    value = (
        "300"
        if form == "seconds"
        else format_datetime(datetime.now(timezone.utc) + timedelta(seconds=300), usegmt=True)
    )
    server.answer = lambda r: (429, {"Retry-After": value}, b"slow down", 0.0)
    write(shards=1, per_shard=2)
    before = django_timezone.now()
    stats = drain_outboxes()
    assert stats.failures == 1 and len(server.received) == 1  # the shard waits
    head = RegionOutbox.objects.order_by("id").first()
    assert head.attempts == 1 and "429" in head.last_error and "slow down" in head.last_error
    # 300 seconds, not the test settings' back-off (30 s base).
    assert before + timedelta(seconds=285) <= head.scheduled_for
    assert head.scheduled_for <= django_timezone.now() + timedelta(seconds=310)


@committing
def test_410_dead_letters_the_message_and_its_shard_goes_on(server, make_relay):
    make_relay()

    def gone_for_the_first(received):
        if json.loads(received.body)["data"]["n"] == 0:
            return 410, {}, b"no such hook", 0.0
        return 200, {}, b"", 0.0

    server.answer = gone_for_the_first
    rows = write(shards=1, per_shard=2)
    stats = drain_outboxes()
    assert (stats.dead_lettered, stats.failures) == (1, 0)
    dead = RegionOutbox.objects.dead().get()
    assert dead.payload == {"shard": 0, "n": 0} and "410" in dead.last_error
    assert not RegionOutbox.objects.pending().exists()
    assert [r.headers["webhook-id"] for r in server.received] == list(rows)


@committing
def test_500_retries_with_backoff_and_succeeds_later(server, make_relay):
    make_relay()
    answers = iter([(500, {}, b"<h1>Internal\n  Error</h1>", 0.0), (204, {}, b"", 0.0)])
    server.answer = lambda r: next(answers)
    write(shards=1, per_shard=1)
    before = django_timezone.now()
    assert drain_outboxes().failures == 1
    row = RegionOutbox.objects.get()
    assert row.attempts == 1 and row.scheduled_for > before + timedelta(seconds=5)
    assert "answered 500 Internal Server Error: '<h1>Internal Error</h1>'" in row.last_error
    assert "WebhookError" in row.last_error
    make_due()
    assert drain_outboxes().failures == 0 and not RegionOutbox.objects.exists()
    first, second = server.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == str(row.message_id)
    assert (first.headers["outbox-attempt"], second.headers["outbox-attempt"]) == ("1", "2")


@committing
def test_another_4xx_is_an_ordinary_failure(server, make_relay):
    make_relay()
    server.answer = lambda r: (400, {"Retry-After": "900"}, b"bad request", 0.0)
    write(shards=1, per_shard=1)
    before = django_timezone.now()
    drain_outboxes()
    row = RegionOutbox.objects.get()
    assert row.dead_at is None and "400" in row.last_error
    assert row.scheduled_for < before + timedelta(seconds=600)  # back-off, not Retry-After


@committing
def test_a_server_slower_than_the_timeout_fails_the_attempt(server, make_relay):
    make_relay(timeout=0.3)
    # The server answers only once the test lets it (or, should the relay wait, once the
    # server gives up waiting), and notes when it did.
    release, answered = threading.Event(), threading.Event()

    def answer(received):
        release.wait(10)
        answered.set()
        return 200, {}, b"too late", 0.0

    server.answer = answer
    rows = write(shards=1, per_shard=1)
    try:
        stats = drain_outboxes()
        assert not answered.is_set()  # the relay gave up, it did not wait for the answer
    finally:
        release.set()
    assert stats.failures == 1
    row = RegionOutbox.objects.get()
    assert str(row.message_id) in rows and row.attempts == 1
    assert "timed out after 0.3 s" in row.last_error


@committing
def test_a_refused_connection_fails_the_attempt(make_relay):
    make_relay(url="http://127.0.0.1:9/nothing-listens-here", timeout=2)
    write(shards=1, per_shard=1)
    assert drain_outboxes().failures == 1
    assert "failed to connect" in RegionOutbox.objects.get().last_error


@committing
@pytest.mark.parametrize("concurrency, in_flight", [(3, 3), (None, 8)])
def test_the_drains_slots_post_at_once_up_to_the_relays_concurrency(
    server, make_relay, concurrency, in_flight
):
    # Each slot thread POSTs the message it delivers; `concurrency` bounds them.
    make_relay(concurrency=concurrency)
    server.answer = lambda r: (200, {}, b"", 0.2)
    write(shards=8, per_shard=1)
    assert drain_outboxes(concurrency=8).failures == 0
    assert len(server.received) == 8 and server.most_in_flight == in_flight


# -- publish, a batch --------------------------------------------------------------------


def messages(shards, per_shard):
    return [
        Message(
            message_id=uuid.uuid4(),
            category=Category.AUDIT_EVENT,
            scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            object_identifier=shard * 1000 + n,
            payload={"shard": shard, "n": n},
        )
        for shard in range(shards)
        for n in range(per_shard)
    ]


def test_a_batch_posts_its_shards_at_once_each_in_order(server, make_relay):
    relay = make_relay(connect=False, concurrency=20)
    # The server answers each shard's first request only once every shard's is in flight
    # (or when the barrier gives up waiting): posted one after another, they never are.
    all_shards = threading.Barrier(20, timeout=5)

    def answer(received):
        if json.loads(received.body)["data"]["n"] == 0:
            with contextlib.suppress(threading.BrokenBarrierError):
                all_shards.wait()
        return 200, {}, b"", 0.05

    server.answer = answer
    assert relay.publish(messages(shards=20, per_shard=3)) == {}
    assert len(server.received) == 60 and server.most_in_flight == 20
    for shard in server.by_shard().values():
        assert [json.loads(r.body)["data"]["n"] for r in shard] == [0, 1, 2]
        # one request of a shard in flight at a time
        assert all(later.started >= earlier.ended for earlier, later in itertools.pairwise(shard))


def test_a_batch_keeps_to_its_concurrency(server, make_relay):
    relay = make_relay(connect=False, concurrency=3)
    server.answer = lambda r: (200, {}, b"", 0.05)
    assert relay.publish(messages(shards=9, per_shard=1)) == {}
    assert server.most_in_flight == 3


def at_once(threads, call):
    """Run `call` on that many threads, started together; their results."""
    barrier = threading.Barrier(threads)
    results = []

    def run():
        barrier.wait()
        results.append(call())

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return results


def test_callers_beyond_the_relays_concurrency_never_wait_for_a_connection(server, make_relay):
    # The engine may run more slot threads (`drain_outboxes --concurrency`) than the
    # relay's concurrency (OUTBOX_CONCURRENCY, 1 in the test settings).
    relay = make_relay(connect=False)
    # Each answer takes a second: long beside a loaded machine's delay in starting the
    # eight threads, so all eight overlap unless one waits for another's connection.
    server.answer = lambda r: (200, {}, b"", 1.0)
    assert at_once(8, lambda: relay.publish(messages(1, 1))) == [{}] * 8
    assert server.most_in_flight == 8


def test_threads_sharing_a_relay_lose_no_request(server, make_relay):
    # A pool that makes requests wait for a connection may close one it has just handed
    # to a waiting request (encode/httpcore#1110): that request fails.
    relay = make_relay(connect=False, timeout=2)

    def calls():
        return [relay.publish(messages(1, 1)) for _ in range(100)]

    results = at_once(16, calls)
    assert [failures for result in results for failures in result if failures] == []
    assert len(server.received) == 1600


def test_a_failure_in_a_batch_stops_that_shard_only(server, make_relay):
    relay = make_relay(connect=False, concurrency=8)
    batch = messages(shards=8, per_shard=3)
    broken = batch[5 * 3 + 1]  # shard 5, its second message

    def unavailable_for_broken(received):
        if received.headers["webhook-id"] == str(broken.message_id):
            return 503, {}, b"down", 0.0
        return 200, {}, b"", 0.0

    server.answer = unavailable_for_broken
    failed = relay.publish(batch)
    after = batch[5 * 3 + 2]
    assert set(failed) == {broken.message_id, after.message_id}
    assert failed[after.message_id] is failed[broken.message_id]
    assert isinstance(failed[broken.message_id], WebhookError)
    assert failed[broken.message_id].status == 503
    sent = {r.headers["webhook-id"] for r in server.received}
    assert str(after.message_id) not in sent
    assert sent == {str(m.message_id) for m in batch} - {str(after.message_id)}


def test_retry_after_and_gone_become_the_engines_failures(server, make_relay):
    relay = make_relay(connect=False)
    server.answer = lambda r: (503, {"Retry-After": "42"}, b"maintenance", 0.0)
    (message,) = messages(1, 1)
    failure = relay.publish([message])[message.message_id]
    assert isinstance(failure, RetryLater) and failure.delay_seconds == 42
    server.answer = lambda r: (410, {}, b"", 0.0)
    assert isinstance(relay.publish([message])[message.message_id], PermanentFailure)
    server.answer = lambda r: (503, {}, b"", 0.0)  # no Retry-After: ordinary back-off
    assert type(relay.publish([message])[message.message_id]) is WebhookError


# -- secrets, configuration ---------------------------------------------------------------


def test_every_secret_form_signs_for_its_consumer(server, make_relay):
    key = os.urandom(25)
    encoded = base64.b64encode(key).decode()
    old, new = new_secret(), f"whsec_{encoded}"
    for secret, verifiers in [
        (key, [f"whsec_{encoded}"]),  # the raw key
        (encoded.rstrip("="), [encoded]),  # base64 alone, its padding dropped
        ([old, new], [old, new]),  # rotating: either verifies
    ]:
        server.received.clear()
        relay = make_relay(connect=False, secret=secret)
        assert relay.check() == [] and relay.publish(messages(1, 1)) == {}
        (received,) = server.received
        for verifier in verifiers:
            Webhook(verifier).verify(received.body, received.headers)


def test_check_reports_what_is_wrong(make_relay):
    relay = make_relay(url="ftp://example.com/x", secret="whsec_not base64!", timeout=0)
    errors = relay.check()
    texts = [error.msg for error in errors]
    assert {error.id for error in errors} == {"outbox.E023"} and len(texts) == 3
    assert any("secret #1 does not decode" in text for text in texts)
    assert any("http:// or https://" in text for text in texts)
    assert any("timeout must be" in text for text in texts)
    assert "not base64!" not in " ".join(texts)  # the secret is never shown
    # The system checks run it for a connected relay.
    assert relay in [error.obj for error in run_checks() if error.id == "outbox.E023"]
    for url in ["http://", "example.com/hooks", "https://exa mple.com:99999/"]:
        assert make_relay(connect=False, url=url).check(), url
    assert make_relay(connect=False).check() == []


def test_a_misconfigured_relay_fails_each_message_and_says_why(make_relay):
    relay = make_relay(connect=False, url="mailto:ops@example.com")
    (message,) = messages(1, 1)
    failure = relay.publish([message])[message.message_id]
    assert isinstance(failure, OutboxConfigurationError) and "http://" in str(failure)


@pytest.mark.parametrize("concurrency", [0, True, 1.5])
def test_concurrency_must_be_a_whole_number(make_relay, concurrency):
    with pytest.raises(OutboxConfigurationError, match="concurrency must be a whole number"):
        make_relay(connect=False, concurrency=concurrency)


def test_without_urllib3_the_relay_names_the_extra(monkeypatch):
    import outbox.relays
    import outbox.relays.webhooks

    monkeypatch.setattr(outbox.relays, "webhooks", outbox.relays.webhooks)  # put back after
    monkeypatch.setitem(sys.modules, "urllib3", None)  # `import urllib3` raises ImportError
    monkeypatch.delitem(sys.modules, "outbox.relays.webhooks")
    module = importlib.import_module("outbox.relays.webhooks")
    with pytest.raises(ImportError, match=r'pip install "django-outboxes\[webhooks\]"') as caught:
        module.WebhookRelay("hook", url="https://example.com", secret=new_secret())
    assert isinstance(caught.value, OutboxConfigurationError)


def test_retry_after_reads_seconds_and_http_dates():
    now = time.time()
    later = datetime.fromtimestamp(now, timezone.utc) + timedelta(seconds=120)
    assert retry_after("120") == 120.0
    assert retry_after(format_datetime(later, usegmt=True), now=now) == pytest.approx(120, abs=1)
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date past: no delay
    for unreadable in [None, "", "soon", "-5", "inf"]:
        assert retry_after(unreadable) is None
