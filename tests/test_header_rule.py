"""The header rule (outbox.headers): a writer's headers cannot steer a relay. Reserved
names, non-token names and control characters are refused when a row is written; a row
that holds them anyway (written before the rule) reaches every relay's transport with
the relay's own headers and without the reserved ones, checked where the messages land:
RabbitMQ, Redis, Kafka (librdkafka's mock cluster), an HTTP server and a Celery worker
on RabbitMQ."""

import base64
import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import transaction
from django.test import override_settings

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import InvalidOutboxMessage
from outbox.models import ControlOutbox, RegionOutbox
from outbox.relays import Relay
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.relay_helpers import message
from tests.testapp.categories import Category
from tests.workers import ROOT, celery_worker, wait_until

pytestmark = committing

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
# What a row written before the rule may hold: the relays' own id, Celery's task
# routing, HTTP framing and credentials, beside a header a writer may set.
FORGED = {
    "outbox-message-id": "forged",
    "Outbox-Shard": "forged",
    "task": "tests.not_relayed",
    "id": "forged",
    "eta": "2999-01-01T00:00:00+00:00",
    "content-length": "2",
    "host": "forged.example",
    "authorization": "Bearer forged",
    "x-tenant": "acme",
}
REFUSED = {name for name in FORGED if name != "x-tenant"}


# -- when a row is written ---------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"task": "admin.purge"}, "header 'task' is reserved .Celery reads it"),
        ({"ETA": "2999-01-01"}, "header 'ETA' is reserved .Celery"),
        ({"content-length": "2"}, "header 'content-length' is reserved .HTTP"),
        ({"Transfer-Encoding": "chunked"}, "header 'Transfer-Encoding' is reserved .HTTP"),
        ({"host": "evil.example"}, "header 'host' is reserved"),
        ({"Authorization": "Bearer x"}, "header 'Authorization' is reserved .a relay's cred"),
        ({"outbox-message-id": "x"}, r"header 'outbox-message-id' is reserved .outbox-\*"),
        ({"x-a\n": "v"}, r"header name 'x-a\\n' is not an HTTP token"),
        ({"a b": "v"}, "header name 'a b' is not an HTTP token"),
        ({"x-a": "v\r\nx-b: injected"}, r"header 'x-a' has a control character .'\\r'"),
        ({"x-a": "\x1b[31m"}, r"header 'x-a' has a control character .'\\x1b'"),
    ],
)
def test_a_header_a_writer_may_not_set_is_refused_and_nothing_is_written(headers, message):
    with outbox_context(transaction.atomic(), flush=False):
        with pytest.raises(InvalidOutboxMessage, match=message):
            RegionOutboxFactory(headers=headers)
        with pytest.raises(InvalidOutboxMessage, match=message):
            RegionOutbox.objects.bulk_create([RegionOutboxFactory.build(headers=headers)])
        RegionOutboxFactory(shard_identifier=99, headers={"x-tenant": "v\tw"})  # tab is fine
    assert list(RegionOutbox.objects.values_list("shard_identifier", flat=True)) == [99]


@pytest.mark.parametrize("region", ["us\r\nx-forged: 1", "us\n", "us\x1b[2J"])
def test_a_region_name_with_a_control_character_is_refused(region):
    refused = pytest.raises(InvalidOutboxMessage, match=r"region_name .* a control character")
    with refused, outbox_context(transaction.atomic(using="control"), flush=False):
        ControlOutboxFactory(region_name=region)
    assert not ControlOutbox.objects.exists()


@override_settings(OUTBOX_WRITER_HEADERS_ALLOWED=["Authorization"])
def test_credentials_are_accepted_when_the_project_allows_them():
    RegionOutboxFactory(headers={"authorization": "Bearer tenant-token"})
    with pytest.raises(InvalidOutboxMessage, match="'proxy-authorization' is reserved"):
        RegionOutboxFactory(headers={"proxy-authorization": "Basic x"})


@override_settings(OUTBOX_WRITER_HEADERS_ALLOWED=["authorization", "Content-Length", "task"])
def test_only_credentials_can_be_allowed():
    [error] = [e for e in run_checks() if e.id == "outbox.E024"]
    assert "['Content-Length', 'task']" in error.msg


# -- what each relay sends ---------------------------------------------------------


def forged_message():
    """A message whose stored headers break the rule, as a row written before it may."""
    return message(7, headers=FORGED)


def assert_the_relay_headers_won(message, received):
    """`received`: the headers (or fields) as the consumer read them."""
    lowered = {name.lower(): value for name, value in received.items()}
    assert lowered["outbox-message-id"] == str(message.message_id)
    assert lowered["outbox-shard"] == "ORGANIZATION:7"
    assert lowered["x-tenant"] == "acme"
    for name in REFUSED:
        assert lowered.get(name.lower()) != FORGED[name], f"the writer's {name} was sent"


def send_amqp(message):
    kombu = pytest.importorskip("kombu")
    from outbox.relays import AmqpRelay

    exchange = f"outbox-test-rule-{uuid.uuid4().hex[:8]}"
    relay = AmqpRelay(exchange, url=AMQP_URL, exchange=exchange, routing_key="#")
    with kombu.Connection(AMQP_URL) as connection:
        channel = connection.default_channel
        kombu.Exchange(exchange, "topic", durable=True)(channel).declare()
        queue = kombu.Queue(exchange, kombu.Exchange(exchange, "topic"), routing_key="#")
        bound = queue(channel)
        bound.declare()
        try:
            assert relay.publish([message]) == {}
            got = bound.get(no_ack=True)
            return got.headers
        finally:
            relay.close()
            bound.delete()
            kombu.Exchange(exchange)(channel).delete()


def send_redis(message):
    redis = pytest.importorskip("redis")
    from outbox.relays import RedisStreamRelay

    stream = f"outbox-test-rule-{uuid.uuid4().hex[:8]}"
    relay = RedisStreamRelay(stream, url="redis://127.0.0.1:6379/0", stream=stream)
    client = redis.Redis(port=6379)
    try:
        assert relay.publish([message]) == {}
        [(_, fields)] = client.xrange(stream)
        return {name.decode(): value.decode() for name, value in fields.items()}
    finally:
        relay.close()
        client.delete(stream)
        client.close()


def send_kafka(message):
    pytest.importorskip("confluent_kafka")
    from outbox.relays import KafkaRelay
    from tests.test_relay_kafka import MockCluster

    cluster = MockCluster()
    topic = f"t{uuid.uuid4().hex[:12]}"
    relay = KafkaRelay(topic, config={"bootstrap.servers": cluster.bootstrap}, topic=topic)
    try:
        assert relay.publish([message]) == {}
        [record] = cluster.records(topic, 1)
        return {name: value.decode() for name, value in record.headers()}
    finally:
        relay.close()


class _Recorder(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def send_webhook(message):
    from outbox.relays import WebhookRelay

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    relay = WebhookRelay(
        "rule",
        url=f"http://127.0.0.1:{server.server_address[1]}/hook",
        secret=secret,
        headers={"Authorization": "Bearer relay"},
    )
    try:
        assert relay.publish([message]) == {}
        [(headers, body)] = _Recorder.received
        assert int(headers["content-length"]) == len(body) > 2
        assert headers["authorization"] == "Bearer relay"
        assert headers["host"] == f"127.0.0.1:{server.server_address[1]}"
        return headers
    finally:
        relay.close()
        server.shutdown()
        server.server_close()


SENDERS = {
    "AmqpRelay": send_amqp,
    "RedisStreamRelay": send_redis,
    "KafkaRelay": send_kafka,
    "WebhookRelay": send_webhook,
}


@pytest.mark.parametrize("relay", sorted(SENDERS))
def test_every_relay_sends_its_own_headers_and_none_a_writer_may_not_set(relay):
    message = forged_message()
    assert_the_relay_headers_won(message, SENDERS[relay](message))


def test_every_relay_is_covered_by_the_rule_tests():
    import outbox.relays

    shipped = {name for name in outbox.relays.__all__ if name.endswith("Relay") and name != "Relay"}
    assert all(issubclass(getattr(outbox.relays, name), Relay) for name in shipped)
    # The Celery-task relay is checked with a real worker below.
    assert shipped == {*SENDERS, "CeleryTaskRelay"}


# -- Celery: a writer's headers cannot pick the task a worker runs ------------------


@pytest.fixture(scope="module")
def amqp_worker(tmp_path_factory):
    """A Celery worker on RabbitMQ, on a queue of its own; yields (queue, calls file)."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the Celery tests run on PostgreSQL")
    kombu = pytest.importorskip("kombu")
    try:
        with kombu.Connection(AMQP_URL, connect_timeout=2) as probe:
            probe.ensure_connection(max_retries=1)
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"RabbitMQ at {AMQP_URL} is required in CI: {exc}")
        pytest.skip(f"RabbitMQ at {AMQP_URL} is unreachable: {exc}")
    queue = f"outbox-test-rule-{uuid.uuid4().hex[:10]}"
    directory = tmp_path_factory.mktemp("rule")
    calls = directory / "calls.jsonl"
    calls.touch()
    env = os.environ.copy()
    env["OUTBOX_TEST_RELAYED_FILE"] = str(calls)
    env["OUTBOX_TEST_BROKER_URL"] = AMQP_URL
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    process = celery_worker("rule", queue, directory, env, concurrency=1)
    yield queue, calls
    process.stop()
    with kombu.Connection(AMQP_URL) as connection:
        connection.default_channel.queue_delete(queue)


def test_a_writers_headers_cannot_pick_the_task_nor_delay_it(amqp_worker):
    import celery

    from outbox.relays import CeleryTaskRelay

    queue, calls = amqp_worker
    app = celery.Celery("rule", broker=AMQP_URL, set_as_current=False)
    relay = CeleryTaskRelay("rule", task="tests.relayed", app=app, queue=queue)
    relay.connect(Category.AUDIT_EVENT)
    try:
        row = RegionOutboxFactory(shard_identifier=7, headers={"x-tenant": "acme"})
        RegionOutbox.objects.filter(pk=row.pk).update(headers=FORGED)  # as before the rule
        drain_outboxes()
        assert not RegionOutbox.objects.exists()

        def read():
            return [json.loads(line) for line in calls.read_text().splitlines() if line]

        wait_until(read, timeout=30, message="the relayed task did not run")
    finally:
        relay.disconnect()
        app.close()
    [call] = read()
    assert call["task"] == "tests.relayed"
    assert call["task_id"] == str(row.message_id)
    assert call["headers"]["outbox-message-id"] == str(row.message_id)
    assert call["headers"]["x-tenant"] == "acme"
    assert call["headers"].get("eta") is None
