"""The relay base (outbox/relays/base.py, envelope.py) as a relay's author and its users
rely on it: a Relay subclass that records what it publishes, connected to categories and
scopes and drained by the real engine."""

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import router, transaction
from django.db.models.functions import Now
from django.utils import timezone as django_timezone

from outbox import PermanentFailure, RetryLater, outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.relays import Bare, CloudEvents, Message, Relay, relays, skip_after_failure
from outbox.signals import process_region_outbox
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category, Scope

pytestmark = committing

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Recording(Relay):
    """Publishes nowhere: records each message it was given, and fails a message for
    which `failing(message)` returns an exception."""

    def __init__(self, name="recording", *, failing=None, **options) -> None:
        super().__init__(name, **options)
        self.failing = failing or (lambda message: None)
        self.seen: list[Message] = []

    def publish(self, messages):
        def send(message):
            self.seen.append(message)
            error = self.failing(message)
            if error is not None:
                raise error

        return skip_after_failure(messages, send)


@pytest.fixture
def made():
    """Relays connected by a test, disconnected at its end."""
    found = []
    yield found
    for relay in found:
        relay.disconnect()


def connected(made, *targets, **options):
    relay = Recording(options.pop("name", f"rec-{uuid.uuid4().hex[:8]}"), **options)
    made.append(relay)
    return relay.connect(*targets)


def make_due():
    """End every back-off now."""
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.pending().update(scheduled_for=Now())


def fail_times(count, error=RuntimeError):
    """A `failing` that fails the first `count` calls."""
    calls = []

    def failing(message):
        calls.append(message)
        return error(f"down (call {len(calls)})") if len(calls) <= count else None

    return failing


# -- what a relay is given ----------------------------------------------------------


def test_a_message_carries_the_rows_fields(made):
    relay = connected(made, Category.AUDIT_EVENT)
    row = RegionOutboxFactory(
        shard_identifier=5,
        object_identifier=77,
        payload={"name": "Ä", "seats": [1, 2]},
        headers={"traceparent": TRACEPARENT, "tenant": "acme"},
    )
    drain_outboxes()
    [message] = relay.seen
    assert message == Message(
        message_id=row.message_id,
        category=Category.AUDIT_EVENT,
        scope=Scope.ORGANIZATION,
        shard_identifier=5,
        object_identifier=77,
        payload={"name": "Ä", "seats": [1, 2]},
        attempt=1,
        headers={"traceparent": TRACEPARENT, "tenant": "acme"},
        region_name=None,
        using=router.db_for_write(RegionOutbox),
    )
    assert message.shard_key == "ORGANIZATION:5"
    assert message.relay_headers() == {
        "outbox-message-id": str(row.message_id),
        "outbox-category": "AUDIT_EVENT",
        "outbox-shard": "ORGANIZATION:5",
        "outbox-attempt": "1",
        "traceparent": TRACEPARENT,
        "tenant": "acme",
    }
    assert not RegionOutbox.objects.exists()


def test_a_control_message_carries_its_region(made):
    relay = connected(made, Category.USER_UPDATE)
    row = ControlOutboxFactory(region_name="eu", shard_identifier=3, object_identifier=9)
    drain_outboxes()
    [message] = relay.seen
    assert (message.message_id, message.region_name, message.scope) == (
        row.message_id,
        "eu",
        Scope.USER,
    )
    assert message.using == router.db_for_write(ControlOutbox) == "control"
    assert message.shard_key == "USER:3:eu"
    assert message.relay_headers()["outbox-shard"] == "USER:3:eu"


def test_the_synchronous_flush_reaches_a_relay(made):
    relay = connected(made, Category.AUDIT_EVENT)
    with outbox_context(transaction.atomic(), flush=True):
        row = RegionOutboxFactory(shard_identifier=1)
        assert relay.seen == []  # not before the commit
    assert [message.message_id for message in relay.seen] == [row.message_id]


def test_the_attempt_counts_up_on_retries_with_the_same_id(made):
    relay = connected(made, Category.AUDIT_EVENT, failing=fail_times(2))
    row = RegionOutboxFactory(shard_identifier=1)
    for _ in range(3):
        drain_outboxes()
        make_due()
    assert [(m.message_id, m.attempt) for m in relay.seen] == [
        (row.message_id, n) for n in (1, 2, 3)
    ]
    assert [m.relay_headers()["outbox-attempt"] for m in relay.seen] == ["1", "2", "3"]
    assert not RegionOutbox.objects.exists()


def test_a_v7_id_gives_the_messages_time():
    row_id = uuid.UUID("01a21ba6-a981-72f1-8706-3a0632829de2")
    message = Message(row_id, Category.AUDIT_EVENT, Scope.ORGANIZATION, 1, 1, None)
    assert message.time == datetime.fromtimestamp((row_id.int >> 80) / 1000, tz=timezone.utc)
    assert message.time.microsecond % 1000 == 0
    # An id the database made (random, version 4): the time is now.
    before = datetime.now(tz=timezone.utc)
    random = Message(uuid.uuid4(), Category.AUDIT_EVENT, Scope.ORGANIZATION, 1, 1, None)
    assert before <= random.time <= datetime.now(tz=timezone.utc)


def test_a_drained_messages_time_is_when_it_was_written(made):
    relay = connected(made, Category.AUDIT_EVENT)
    row = RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    [message] = relay.seen
    assert message.message_id.version == 7
    assert abs(message.time - row.date_added) < timedelta(seconds=5)


# -- connecting -----------------------------------------------------------------------


def test_a_scope_stands_for_all_its_categories(made):
    relay = connected(made, Scope.ORGANIZATION)
    assert relay.categories == {
        Category.ORGANIZATION_UPDATE,
        Category.AUDIT_EVENT,
        Category.LEDGER_ENTRY,
    }
    RegionOutboxFactory(shard_identifier=1, category=Category.ORGANIZATION_UPDATE)
    RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT)
    ControlOutboxFactory(shard_identifier=1)  # USER scope: not this relay's
    drain_outboxes()
    assert [message.category for message in relay.seen] == [
        Category.ORGANIZATION_UPDATE,
        Category.AUDIT_EVENT,
    ]
    assert not ControlOutbox.objects.exists()  # the app's own receiver had it


def test_connect_to_the_region_signal_only(made):
    relay = Recording("region-only")
    made.append(relay)
    relay.connect(Category.USER_UPDATE, signals=[process_region_outbox])
    ControlOutboxFactory(shard_identifier=1, object_identifier=1)  # the control table's
    RegionOutboxFactory(shard_scope=Scope.USER, category=Category.USER_UPDATE, object_identifier=2)
    drain_outboxes()
    # The region's message reached the relay, the control table's did not.
    assert [message.object_identifier for message in relay.seen] == [2]
    assert not RegionOutbox.objects.exists() and not ControlOutbox.objects.exists()


def test_a_failed_relay_is_retried_and_a_receiver_that_succeeded_is_not(made, calls):
    relay = connected(made, Category.AUDIT_EVENT, name="flaky", failing=fail_times(1))
    RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    row = RegionOutbox.objects.get()
    assert row.attempts == 1
    assert "tests.test_relays_base.Recording[flaky]: RuntimeError: down (call 1)" in row.last_error
    assert len(calls.calls) == 1
    make_due()
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    assert len(relay.seen) == 2
    assert len(calls.calls) == 1


def test_a_relay_that_published_is_not_called_again_when_a_receiver_failed(made, calls):
    relay = connected(made, Category.AUDIT_EVENT, name="steady")
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    row = RegionOutbox.objects.get()
    # Recorded under the relay's name: the retry skips it.
    assert json.loads(row.delivered_to) == ["tests.test_relays_base.Recording[steady]"]
    calls.failing = set()
    make_due()
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    assert len(relay.seen) == 1
    assert len(calls.calls) == 1


def test_retry_later_and_permanent_failure_from_a_relay(made):
    connected(
        made,
        Category.AUDIT_EVENT,
        failing=lambda m: RetryLater(600) if m.shard_identifier == 1 else PermanentFailure("no"),
    )
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    drain_outboxes()
    later = RegionOutbox.objects.get(shard_identifier=1)
    assert later.dead_at is None
    delay = (later.scheduled_for - django_timezone.now()).total_seconds()
    assert 590 < delay <= 600
    dead = RegionOutbox.objects.get(shard_identifier=2)
    assert dead.dead_at is not None and "PermanentFailure: no" in dead.last_error


# -- names ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", " x", "has space", "-lead", "x" * 101, "a/b", 5, None])
def test_a_name_must_be_short_plain_and_a_string(name):
    with pytest.raises(OutboxConfigurationError, match="A relay's name must be 1 to 100"):
        Recording(name)


@pytest.mark.parametrize("name", ["a", "9", "billing.hook-1_x", "x" * 100])
def test_names_a_relay_may_have(name):
    assert Recording(name).name == name


def test_two_relays_with_one_name_are_refused_and_disconnect_frees_it(made):
    first = connected(made, Category.AUDIT_EVENT, name="billing")
    assert relays["billing"] is first
    assert first.connect(Category.ORGANIZATION_UPDATE) is first  # the same relay: fine
    second = Recording("billing")
    with pytest.raises(OutboxConfigurationError, match="Two relays are named 'billing'"):
        second.connect(Category.AUDIT_EVENT)

    first.disconnect()
    assert "billing" not in relays
    made.append(second.connect(Category.AUDIT_EVENT))
    RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    assert (len(first.seen), len(second.seen)) == (0, 1)


def test_connect_needs_categories_or_scopes():
    relay = Recording("picky")
    with pytest.raises(OutboxConfigurationError, match="needs at least one category"):
        relay.connect()
    with pytest.raises(OutboxConfigurationError, match=r"not 2 \(int\)"):
        relay.connect(2)
    assert "picky" not in relays


# -- checks ---------------------------------------------------------------------------


class Misconfigured(Recording):
    def check(self):
        return [self.error("its URL has no host")]


def test_a_relays_check_errors_stop_manage_py_check(made):
    call_command("check")  # nothing to say yet
    relay = Misconfigured("hook")
    made.append(relay.connect(Category.AUDIT_EVENT))
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "(outbox.E023) Relay 'hook': its URL has no host" in str(raised.value)
    relay.disconnect()
    call_command("check")


# -- envelopes ------------------------------------------------------------------------


def delivered_message(made, **row_fields):
    relay = connected(made, Category.AUDIT_EVENT)
    row = RegionOutboxFactory(**row_fields)
    drain_outboxes()
    [message] = relay.seen
    return row, message


def parsed(envelope, message):
    headers = {"content-type": envelope.content_type}
    headers.update({f"ce-{name}": value for name, value in envelope.attributes(message).items()})
    return from_http(HTTPMessage(headers=headers, body=envelope.body(message)), JSONFormat())


@pytest.mark.parametrize("binary", [False, True], ids=["structured", "binary"])
def test_cloudevents_parse_back(made, binary):
    row, message = delivered_message(
        made,
        shard_identifier=4,
        object_identifier=12,
        payload={"total": "9.50", "lines": [{"sku": "ä"}]},
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
    )
    envelope = CloudEvents(binary=binary)
    assert envelope.content_type == (
        "application/json" if binary else "application/cloudevents+json"
    )
    event = parsed(envelope, message)
    assert event.get_specversion() == "1.0"
    assert event.get_id() == str(row.message_id)
    assert event.get_type() == "audit_event"
    assert event.get_source() == "/outbox/organization"
    assert event.get_subject() == "12"
    assert event.get_time() == message.time
    assert event.get_datacontenttype() == "application/json"
    assert event.get_data() == {"total": "9.50", "lines": [{"sku": "ä"}]}
    assert event.get_extension("traceparent") == TRACEPARENT
    assert event.get_extension("tracestate") == "vendor=1"


def test_cloudevents_source_type_prefix_and_no_trace_context(made):
    _, message = delivered_message(made, shard_identifier=1, payload=None)
    envelope = CloudEvents(source="https://billing.example/orgs", type_prefix="com.example.")
    event = parsed(envelope, message)
    assert (event.get_source(), event.get_type()) == (
        "https://billing.example/orgs",
        "com.example.audit_event",
    )
    assert event.get_extension("traceparent") is None
    assert "traceparent" not in json.loads(envelope.body(message))


def test_the_bare_envelope_is_the_payload(made):
    _, message = delivered_message(made, shard_identifier=1, payload={"a": [1, None]})
    envelope = Relay("bare-one", envelope="bare").envelope
    assert isinstance(envelope, Bare)
    assert json.loads(envelope.body(message)) == {"a": [1, None]}
    assert envelope.attributes(message) == {}
    assert envelope.content_type == "application/json"


def test_envelopes_by_name():
    assert not Relay("a").envelope.binary  # the default: structured CloudEvents
    assert Relay("b", envelope="cloudevents-binary").envelope.binary
    with pytest.raises(OutboxConfigurationError, match="Unknown envelope 'avro'"):
        Relay("c", envelope="avro")


# -- the per-shard rule of a batch ----------------------------------------------------


def test_skip_after_failure_keeps_each_shard_in_order():
    messages = [
        Message(uuid.uuid4(), Category.AUDIT_EVENT, Scope.ORGANIZATION, shard, n, {"n": n})
        for n in range(4)
        for shard in range(3)
    ]
    error = ConnectionError("shard 1 refused")
    sent = []

    def send(message):
        if (message.shard_identifier, message.object_identifier) == (1, 1):
            raise error
        sent.append((message.shard_identifier, message.object_identifier))

    failed = skip_after_failure(messages, send)
    assert sent == [(s, n) for n in range(4) for s in range(3) if s != 1 or n == 0]
    held = [m.message_id for m in messages if m.shard_identifier == 1 and m.object_identifier]
    assert list(failed) == held
    assert all(failure is error for failure in failed.values())
