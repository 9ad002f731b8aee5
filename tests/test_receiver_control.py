"""Receivers in control: several receivers of one category fail on their own, retry
after their own delay, declare a permanent failure; failures are logged and signalled."""

import json
import logging
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from outbox import PermanentFailure, RetryLater
from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.signals import (
    delivery_failed,
    lease_lost,
    message_dead_lettered,
    message_processed,
    process_region_outbox,
)
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.models import Ledger

pytestmark = committing

second_calls: list[dict] = []
behaviour: dict[str, Exception | None] = {"raise": None}


def second_receiver(sender, **kwargs):
    """Another receiver of AUDIT_EVENT, beside the test app's recording one."""
    second_calls.append(kwargs)
    if behaviour["raise"] is not None:
        raise behaviour["raise"]


@contextmanager
def connected(receiver, signal=process_region_outbox, category=Category.AUDIT_EVENT):
    signal.connect(receiver, sender=category, weak=False)
    try:
        yield
    finally:
        signal.disconnect(receiver, sender=category)


@pytest.fixture(autouse=True)
def fresh():
    second_calls.clear()
    behaviour["raise"] = None
    yield
    second_calls.clear()


def make_due():
    """Skip the back-off: every shard and row due now (database clock)."""
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.update(scheduled_for=Now())


def test_one_failing_receiver_does_not_stop_the_others(calls):
    behaviour["raise"] = RuntimeError("second is down")
    row = RegionOutboxFactory(object_identifier=1, payload={"v": 1})
    with connected(second_receiver):
        stats = drain_outboxes()
    assert calls.payloads() == [{"v": 1}]  # the recording receiver ran
    assert len(second_calls) == 1 and stats.failures == 1
    kept = RegionOutbox.objects.get()
    assert kept.id == row.id and kept.attempts == 1
    assert json.loads(kept.delivered_to) == ["tests.testapp.receivers.record"]
    assert "second is down" in kept.last_error and "Traceback" in kept.last_traceback


def test_a_retry_skips_the_receivers_that_already_succeeded(calls):
    behaviour["raise"] = RuntimeError("second is down")
    RegionOutboxFactory(object_identifier=1, payload={"v": 1})
    with connected(second_receiver):
        drain_outboxes()
        behaviour["raise"] = None
        make_due()
        drain_outboxes()
    assert calls.payloads() == [{"v": 1}]  # not called again for the same row
    assert len(second_calls) == 2
    assert not RegionOutbox.objects.exists()


def test_a_newer_row_coalesced_in_goes_to_every_receiver(calls):
    behaviour["raise"] = RuntimeError("second is down")
    RegionOutboxFactory(object_identifier=1, payload={"v": 1})
    with connected(second_receiver):
        drain_outboxes()
        behaviour["raise"] = None
        RegionOutboxFactory(object_identifier=1, payload={"v": 2})
        make_due()
        drain_outboxes()
    assert calls.payloads() == [{"v": 1}, {"v": 2}]
    assert [c["payload"] for c in second_calls] == [{"v": 1}, {"v": 2}]
    assert not RegionOutbox.objects.exists()


def test_retry_later_reschedules_after_the_receivers_own_delay(calls):
    behaviour["raise"] = RetryLater(600, "rate limited")
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    RegionOutboxFactory(shard_identifier=1, object_identifier=2)
    before = timezone.now()
    with connected(second_receiver):
        stats = drain_outboxes()
    assert stats.failures == 1 and len(second_calls) == 1  # the shard waits
    head = RegionOutbox.objects.order_by("id").first()
    # 600 seconds exactly, not the 15-30 s back-off of the test settings.
    assert before + timedelta(seconds=590) <= head.scheduled_for
    assert head.scheduled_for <= timezone.now() + timedelta(seconds=610)
    assert head.attempts == 1 and "rate limited" in head.last_error
    assert ShardLease.objects.get().expires_at >= before + timedelta(seconds=590)


def test_permanent_failure_dead_letters_at_once_and_the_shard_goes_on(calls):
    def refuse(sender, kwargs):
        if kwargs["payload"] == {"v": "poison"}:
            raise PermanentFailure("cannot ever work")

    calls.during_call = refuse
    poison = RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "poison"})
    RegionOutboxFactory(shard_identifier=1, object_identifier=2, payload={"v": "next"})
    stats = drain_outboxes()
    assert calls.payloads() == [{"v": "next"}]
    assert (stats.dead_lettered, stats.failures) == (1, 0)
    dead = RegionOutbox.objects.dead().get()
    assert dead.id == poison.id and dead.attempts == 1 and dead.dead_at is not None
    assert "cannot ever work" in dead.last_error
    assert not RegionOutbox.objects.pending().exists()
    assert not ShardLease.objects.exists()


def test_a_failing_transactional_receiver_rolls_back_every_receiver_of_it(calls):
    def fail_second(sender, **kwargs):
        raise RuntimeError("no")

    RegionOutboxFactory(category=Category.LEDGER_ENTRY, object_identifier=1)
    with connected(fail_second, category=Category.LEDGER_ENTRY):
        drain_outboxes()
        assert not Ledger.objects.exists()
        row = RegionOutbox.objects.get()
        assert row.attempts == 1 and row.delivered_to == ""  # nothing counts as done
        make_due()
        drain_outboxes()  # every receiver runs again, inside the transaction
    assert not Ledger.objects.exists() and len(calls.calls) == 2
    make_due()
    drain_outboxes()  # once the other one is gone, the ledger write commits
    assert Ledger.objects.count() == 1 and not RegionOutbox.objects.exists()


def test_failures_are_logged_with_structured_fields(calls, caplog, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 2
    calls.failing = {3}
    RegionOutboxFactory(shard_identifier=3, object_identifier=9)
    with caplog.at_level(logging.WARNING, logger="outbox.engine"):
        drain_outboxes()
        make_due()
        drain_outboxes()
    first, second = [r for r in caplog.records if getattr(r, "event", "").startswith("outbox.d")]
    assert (first.levelno, first.event, first.attempts) == (
        logging.WARNING,
        "outbox.delivery_failed",
        1,
    )
    assert (second.levelno, second.event, second.attempts) == (
        logging.ERROR,
        "outbox.dead_lettered",
        2,
    )
    assert (second.shard, second.scope, second.category) == ("0/3", 0, Category.AUDIT_EVENT)
    assert second.object_identifier == 9 and second.outbox == "outbox.RegionOutbox"
    assert second.exc_info is not None and "receiver failed" in str(second.exc_info[1])


class Heard:
    def __init__(self):
        self.events = []

    def __call__(self, signal, sender, **kwargs):
        self.events.append((signal, sender, kwargs))

    def of(self, signal):
        return [kwargs for s, _, kwargs in self.events if s is signal]


@pytest.fixture
def heard():
    listener = Heard()
    for signal in (message_processed, delivery_failed, message_dead_lettered, lease_lost):
        signal.connect(listener, weak=False)
    yield listener
    for signal in (message_processed, delivery_failed, message_dead_lettered, lease_lost):
        signal.disconnect(listener)


def test_lifecycle_signals(calls, heard, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    calls.failing = {2}
    RegionOutboxFactory(shard_identifier=2, object_identifier=5)
    drain_outboxes()
    (processed,) = heard.of(message_processed)
    assert (processed["rows"], processed["object_identifier"], processed["using"]) == (
        1 + 1,
        1,
        "default",
    )
    assert processed["duration_seconds"] >= 0
    # Every path reads the newest row's date_added, so the lag is known.
    assert 0 <= processed["lag_seconds"] < 60
    (failed,) = heard.of(delivery_failed)
    assert failed["dead"] is True and failed["attempts"] == 1
    assert isinstance(failed["exception"], RuntimeError)
    (dead,) = heard.of(message_dead_lettered)
    assert dead["shard"].shard_identifier == 2 and "receiver failed" in dead["error"]


def test_message_processed_carries_the_lag_when_date_added_is_read(calls, heard):
    ControlOutboxFactory(shard_identifier=1)
    drain_outboxes([ControlOutbox])
    (processed,) = heard.of(message_processed)
    assert 0 <= processed["lag_seconds"] < 60 and processed["using"] == "control"


def test_lease_lost_is_signalled(calls, heard):
    def steal(sender, kwargs):
        ShardLease.objects.update(token="theirs")

    calls.during_call = steal
    RegionOutboxFactory(shard_identifier=4)
    stats = drain_outboxes()
    assert stats.leases_lost == 1
    assert [e["shard"].shard_identifier for e in heard.of(lease_lost)] == [4]
    assert RegionOutbox.objects.count() == 1
