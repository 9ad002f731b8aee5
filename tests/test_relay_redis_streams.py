"""RedisStreamRelay against the real Redis: rows written in outbox_context and delivered
by the real engine come back from XRANGE in order per shard, under the rows' message
ids, with the relay's fields and the CloudEvents attributes; MAXLEN caps a stream; a
failure holds only its own shard; and a connection cut mid-drain loses nothing."""

import json
import secrets
import sys
import threading
from collections import defaultdict

import pytest
import redis
from django.core.checks import run_checks
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.models import RegionOutbox
from outbox.relays import RedisStreamRelay
from tests.conftest import committing
from tests.factories import ControlOutboxFactory
from tests.relay_helpers import TRACEPARENT, make_due, messages, write
from tests.tcp_proxy import TcpProxy
from tests.testapp.categories import Category

pytestmark = committing

REDIS_PORT = 6379


@pytest.fixture
def prefix():
    """A key prefix of this test's own; its keys are deleted after."""
    prefix = f"outbox-test-{secrets.token_hex(6)}"
    client = redis.Redis(port=REDIS_PORT)
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def client():
    client = redis.Redis(port=REDIS_PORT)
    yield client
    client.close()


@pytest.fixture
def make_relay(prefix):
    """A RedisStreamRelay on this test's keys, connected to AUDIT_EVENT; disconnected
    after the test."""
    made = []

    def make(port=REDIS_PORT, **options):
        options.setdefault("stream", f"{prefix}.{{category}}")
        relay = RedisStreamRelay(
            f"{prefix}-{len(made)}", url=f"redis://127.0.0.1:{port}/0", **options
        )
        made.append(relay)
        return relay.connect(Category.AUDIT_EVENT)

    yield make
    for relay in made:
        relay.disconnect()


def entries(client, stream):
    """The stream's entries, each a dict of str fields."""
    return [
        {name.decode(): value.decode() for name, value in fields.items()}
        for _, fields in client.xrange(stream)
    ]


def payload(entry):
    body = json.loads(entry["body"])
    return body["data"] if entry["content-type"] == "application/cloudevents+json" else body


def ids_per_shard(found):
    by_shard = defaultdict(list)
    for entry in found:
        by_shard[entry["outbox-shard"]].append(entry["outbox-message-id"])
    return dict(by_shard)


def sequences(found):
    """Per shard, the payloads' `n` in stream order, repeats dropped."""
    by_shard = defaultdict(list)
    for entry in found:
        n = payload(entry)["n"]
        if n not in by_shard[entry["outbox-shard"]]:
            by_shard[entry["outbox-shard"]].append(n)
    return dict(by_shard)


def test_drained_messages_reach_the_stream_in_shard_order_under_their_ids(
    make_relay, client, prefix
):
    make_relay()
    rows = write(shards=3, per_shard=4)
    assert drain_outboxes([RegionOutbox]).failures == 0
    assert not RegionOutbox.objects.exists()
    found = entries(client, f"{prefix}.audit_event")
    assert ids_per_shard(found) == {
        f"ORGANIZATION:{shard}": [str(r.message_id) for r in rows if r.shard_identifier == shard]
        for shard in (1, 2, 3)
    }
    assert sequences(found) == {f"ORGANIZATION:{shard}": [0, 1, 2, 3] for shard in (1, 2, 3)}
    first = found[0]
    (row,) = [r for r in rows if str(r.message_id) == first["outbox-message-id"]]
    assert first["outbox-category"] == "AUDIT_EVENT"
    assert first["outbox-attempt"] == "1"
    assert first["traceparent"] == TRACEPARENT
    assert first["content-type"] == "application/cloudevents+json"
    event = json.loads(first["body"])
    assert event["specversion"] == "1.0"
    assert event["id"] == str(row.message_id)
    assert event["type"] == "audit_event"
    assert event["source"] == "/outbox/organization"
    assert event["subject"] == str(row.object_identifier)
    assert event["traceparent"] == TRACEPARENT
    assert event["data"] == row.payload


def test_binary_cloudevents_travel_as_ce_fields_beside_the_bare_payload(make_relay, client, prefix):
    make_relay(envelope="cloudevents-binary")
    (row,) = write(shards=1, per_shard=1)
    drain_outboxes([RegionOutbox])
    (entry,) = entries(client, f"{prefix}.audit_event")
    assert json.loads(entry["body"]) == {"shard": 1, "n": 0}
    assert entry["content-type"] == "application/json"
    assert entry["ce_id"] == entry["outbox-message-id"] == str(row.message_id)
    assert entry["ce_type"] == "audit_event"
    assert entry["ce_specversion"] == "1.0"
    assert entry["ce_subject"] == str(row.object_identifier)
    assert entry["ce_traceparent"] == TRACEPARENT
    assert "ce_datacontenttype" not in entry


def test_a_flush_appends_right_after_commit_to_the_templated_stream(make_relay, client, prefix):
    make_relay(stream=f"{prefix}.{{scope}}.{{category}}.{{shard_identifier}}", envelope="bare")
    rows = write(shards=2, per_shard=1, flush=True)
    assert not RegionOutbox.objects.exists()
    for row in rows:
        (entry,) = entries(client, f"{prefix}.organization.audit_event.{row.shard_identifier}")
        assert entry["outbox-message-id"] == str(row.message_id)
        assert json.loads(entry["body"]) == row.payload


def test_a_control_message_names_its_region_in_the_shard_and_the_stream(make_relay, client, prefix):
    make_relay(stream=f"{prefix}.{{region_name}}.{{category}}").connect(Category.USER_UPDATE)
    with outbox_context(transaction.atomic()):
        row = ControlOutboxFactory(region_name="eu", shard_identifier=7)
    (entry,) = entries(client, f"{prefix}.eu.user_update")
    assert entry["outbox-shard"] == "USER:7:eu"
    assert entry["outbox-category"] == "USER_UPDATE"
    assert json.loads(entry["body"])["source"] == "/outbox/user"
    assert entry["outbox-message-id"] == str(row.message_id)


def test_maxlen_caps_the_stream_to_its_newest_entries(make_relay, client, prefix):
    make_relay(maxlen=3, approximate=False)
    write(shards=1, per_shard=8)
    drain_outboxes([RegionOutbox])
    found = entries(client, f"{prefix}.audit_event")
    assert [payload(entry)["n"] for entry in found] == [5, 6, 7]


def test_approximate_maxlen_trims_whole_nodes_and_keeps_at_least_maxlen(make_relay, client, prefix):
    relay = make_relay(maxlen=10)
    assert relay.publish(messages(shards=1, per_shard=400)) == {}
    assert 10 <= client.xlen(f"{prefix}.audit_event") < 400


def test_a_batch_stops_a_shard_at_its_first_failure_and_publishes_the_others(
    make_relay, client, prefix
):
    """One pipeline per wave: shard 2's second message goes to a key that holds no
    stream; its later messages are not sent and fail with the same error."""
    client.set(f"{prefix}.not-a-stream", "x")

    def stream(message):
        poisoned = (message.shard_identifier, message.object_identifier) == (2, 1)
        return f"{prefix}.not-a-stream" if poisoned else f"{prefix}.events"

    relay = make_relay(stream=stream)
    batch = messages(shards=3, per_shard=4)
    failed = relay.publish(batch)
    shard_2 = [m.message_id for m in batch if m.shard_identifier == 2]
    assert set(failed) == set(shard_2[1:])
    assert "WRONGTYPE" in str(failed[shard_2[1]])
    assert failed[shard_2[2]] is failed[shard_2[1]] is failed[shard_2[3]]
    assert sequences(entries(client, f"{prefix}.events")) == {
        "ORGANIZATION:1": [0, 1, 2, 3],
        "ORGANIZATION:2": [0],
        "ORGANIZATION:3": [0, 1, 2, 3],
    }


def test_a_key_that_is_no_stream_holds_only_its_shard(make_relay, client, prefix):
    client.set(f"{prefix}.2", "x")
    make_relay(stream=f"{prefix}.{{shard_identifier}}")
    write(shards=3, per_shard=2)
    stats = drain_outboxes([RegionOutbox])
    assert stats.failures == 1
    (kept,) = RegionOutbox.objects.filter(shard_identifier=2, attempts=1)
    assert "WRONGTYPE" in kept.last_error
    assert RegionOutbox.objects.filter(shard_identifier=2).count() == 2
    for shard in (1, 3):
        assert len(entries(client, f"{prefix}.{shard}")) == 2


def test_threads_publishing_at_once_each_keep_their_shard_in_order(make_relay, client, prefix):
    relay = make_relay()
    errors = []

    def publish_shard(shard):
        for message in messages(shards=1, per_shard=15, first_shard=shard):
            errors.extend(relay.publish([message]).values())

    threads = [threading.Thread(target=publish_shard, args=(shard,)) for shard in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    found = entries(client, f"{prefix}.audit_event")
    assert len(found) == 8 * 15
    assert sequences(found) == {f"ORGANIZATION:{shard}": list(range(15)) for shard in range(8)}


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_connection_cut_mid_drain_loses_nothing_and_keeps_shard_order(
    make_relay, client, prefix, calls, settings, concurrency
):
    settings.OUTBOX_CONCURRENCY = concurrency
    with TcpProxy("127.0.0.1", REDIS_PORT) as proxy:
        make_relay(port=proxy.port)
        rows = write(shards=4, per_shard=5)
        calls.during_call = cut_after(7, proxy)
        stats = drain_outboxes([RegionOutbox])
        assert stats.failures >= 1
        assert 0 < RegionOutbox.objects.count() < len(rows)
        assert "Connection" in RegionOutbox.objects.filter(attempts=1).first().last_error

        calls.during_call = None
        proxy.start()
        for _ in range(10):
            make_due()
            drain_outboxes([RegionOutbox])
            if not RegionOutbox.objects.exists():
                break
        assert not RegionOutbox.objects.exists()
    found = entries(client, f"{prefix}.audit_event")
    assert {entry["outbox-message-id"] for entry in found} == {str(r.message_id) for r in rows}
    assert sequences(found) == {f"ORGANIZATION:{shard}": [0, 1, 2, 3, 4] for shard in (1, 2, 3, 4)}


def cut_after(deliveries, proxy):
    """A hook for the test receiver (called before the relay, for each message): cut the
    line once `deliveries` messages went through."""
    seen = []
    lock = threading.Lock()

    def hook(sender, kwargs):
        with lock:
            seen.append(kwargs["message_id"])
            if len(seen) == deliveries + 1:
                proxy.stop()

    return hook


def test_check_reports_a_bad_url_and_an_unknown_template_field(make_relay):
    make_relay(stream="{prefix}.{category}")
    relay = RedisStreamRelay("bad-redis", url="http://127.0.0.1:6379/0").connect(
        Category.AUDIT_EVENT
    )
    try:
        errors = [error for error in run_checks() if error.id == "outbox.E023"]
    finally:
        relay.disconnect()
    texts = [error.msg for error in errors]
    assert any("'{prefix}.{category}' names {prefix}" in text for text in texts)
    assert any("'http://127.0.0.1:6379/0' is not a Redis URL" in text for text in texts)
    assert len(errors) == 2


def test_without_redis_py_creating_the_relay_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(OutboxConfigurationError, match=r'pip install "django-outboxes\[redis\]"'):
        RedisStreamRelay("no-client")


@pytest.mark.parametrize("maxlen", [0, -1, True, 2.5, "10"])
def test_maxlen_must_be_a_whole_number_or_none(maxlen):
    with pytest.raises(OutboxConfigurationError, match=r"'capped': maxlen must be a whole number"):
        RedisStreamRelay("capped", maxlen=maxlen)
