"""outbox.testing with pytest: the `outbox_messages` and `outbox_eager` fixtures.

The tests run in pytest-django's test transaction (never committed); under
`django_capture_on_commit_callbacks(execute=True)` the flush runs inside it and delivers
there, with or without `outbox_eager`; inside a transaction the test opened itself, only
with it.
"""

import logging
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from outbox import PermanentFailure, outbox_context
from outbox.engine import Drainer
from outbox.exceptions import DrainInTransaction, FlushInOpenTransaction
from outbox.models import ControlOutbox, RegionOutbox
from outbox.signals import process_region_outbox
from outbox.testing import deliver_pending, eager_delivery, pytest_plugin
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Ledger

# The plugin's fixtures, taken into this module so the tests need no `-p` (and do not
# clash with the plugin when its `pytest11` entry point is installed).
outbox_messages = pytest_plugin.outbox_messages
outbox_eager = pytest_plugin.outbox_eager

pytestmark = pytest.mark.django_db(databases=["default", "control"])


@pytest.fixture
def flushed(django_capture_on_commit_callbacks):
    """Save inside outbox_context; on_commit callbacks run at the end, in the test
    transaction."""

    def save(*factories_kwargs, factory=RegionOutboxFactory):
        using = "control" if factory is ControlOutboxFactory else "default"
        with (
            django_capture_on_commit_callbacks(execute=True, using=using),
            outbox_context(transaction.atomic(using=using)),
        ):
            for kwargs in factories_kwargs:
                factory(**kwargs)

    return save


def test_eager_flush_calls_the_receivers_and_deletes_the_rows(outbox_eager, flushed, calls):
    flushed({"payload": {"v": 1}})
    assert calls.payloads() == [{"v": 1}]
    assert not RegionOutbox.objects.exists()


def test_eager_flush_coalesces_per_group_with_the_newest_payload(outbox_eager, flushed, calls):
    flushed(
        {"object_identifier": 1, "payload": {"v": "old"}},
        {"object_identifier": 2, "payload": {"v": "other"}},
        {"object_identifier": 1, "payload": {"v": "new"}},
    )
    assert calls.payloads() == [{"v": "new"}, {"v": "other"}]
    assert not RegionOutbox.objects.exists()


def test_eager_flush_delivers_control_outboxes_on_their_database(outbox_eager, flushed, calls):
    flushed({"payload": {"v": "c"}}, factory=ControlOutboxFactory)
    assert calls.calls[0]["region_name"] == "us"
    assert calls.payloads() == [{"v": "c"}]
    assert not ControlOutbox.objects.exists()


def test_eager_flush_leaves_rows_of_other_shards_and_later_rows(outbox_eager, flushed, calls):
    RegionOutboxFactory(shard_identifier=2, payload={"v": "other shard"})  # left to the drain
    calls.during_call = lambda sender, kwargs: RegionOutboxFactory(payload={"v": "later"})
    flushed({"payload": {"v": "first"}})
    assert calls.payloads() == [{"v": "first"}]
    assert sorted(p["v"] for p in RegionOutbox.objects.values_list("payload", flat=True)) == [
        "later",
        "other shard",
    ]


def test_eager_flush_stops_a_shard_at_its_first_row_not_due(outbox_eager, flushed, calls):
    RegionOutboxFactory(scheduled_for=timezone.now() + timedelta(hours=1), payload={"v": "later"})
    flushed({"payload": {"v": "due"}})
    assert calls.payloads() == []
    assert RegionOutbox.objects.count() == 2


def test_eager_flush_runs_transactional_receivers(outbox_eager, flushed, calls):
    flushed({"category": Category.LEDGER_ENTRY, "object_identifier": 41})
    assert list(Ledger.objects.values_list("entry", flat=True)) == [41]
    assert not RegionOutbox.objects.exists()


def test_failing_receiver_is_recorded_and_stops_only_its_shard(
    outbox_eager, flushed, calls, caplog
):
    calls.failing = {7}
    with caplog.at_level(logging.WARNING, logger="outbox"):
        flushed(
            {"shard_identifier": 7, "payload": {"v": 1}},
            {"shard_identifier": 7, "payload": {"v": 2}},
            {"shard_identifier": 8, "payload": {"v": 3}},
        )
    assert calls.payloads() == [{"v": 3}]
    failed = RegionOutbox.objects.order_by("id").first()
    assert failed.attempts == 1
    assert "receiver failed for shard 7" in failed.last_error
    assert failed.scheduled_for > failed.date_added
    assert RegionOutbox.objects.filter(shard_identifier=7, attempts=0).count() == 1
    assert any("shard ORGANIZATION/7" in message for message in caplog.messages)


def test_permanent_failure_dead_letters_and_the_shard_goes_on(flushed, calls, caplog):
    def give_up(sender, object_identifier, **kwargs):
        raise PermanentFailure("never")

    process_region_outbox.connect(give_up, sender=Category.ORGANIZATION_UPDATE)
    try:
        with eager_delivery(), caplog.at_level(logging.ERROR, logger="outbox"):
            flushed(
                {"category": Category.ORGANIZATION_UPDATE, "payload": {"v": 1}},
                {"payload": {"v": 2}},
            )
    finally:
        process_region_outbox.disconnect(give_up, sender=Category.ORGANIZATION_UPDATE)
    assert calls.payloads(Category.AUDIT_EVENT) == [{"v": 2}]
    assert list(RegionOutbox.objects.dead().values_list("payload", flat=True)) == [{"v": 1}]


def test_raise_errors_raises_the_receivers_error(flushed, calls):
    calls.failing = {7}
    with eager_delivery(raise_errors=True), pytest.raises(RuntimeError, match="shard 7"):
        flushed({"shard_identifier": 7})
    assert RegionOutbox.objects.get().attempts == 1


def test_the_capture_delivers_without_the_fixture(flushed, calls):
    """pytest-django's test transaction is TestCase's: its capture delivers there."""
    flushed(
        {"object_identifier": 1, "payload": {"v": "old"}},
        {"object_identifier": 1, "payload": {"v": "new"}},
    )
    flushed({"payload": {"v": "c"}}, factory=ControlOutboxFactory)
    assert calls.payloads() == [{"v": "new"}, {"v": "c"}]
    assert not RegionOutbox.objects.exists()
    assert not ControlOutbox.objects.exists()


def test_inside_the_tests_own_transaction_the_flush_raises_a_clear_error(flushed, calls):
    with (
        pytest.raises(FlushInOpenTransaction, match="outbox_eager") as raised,
        transaction.atomic(),
    ):
        flushed({"payload": {"v": 1}})
    assert isinstance(raised.value, DrainInTransaction)
    assert "End the capture outside that block" in str(raised.value)
    assert "transaction=True" in str(raised.value)
    assert calls.calls == []


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_a_flush_run_early_in_a_real_transaction_raises_a_clear_error(flushed, calls):
    """No TestCase transaction at all: the test's own atomic block is a real one."""
    with pytest.raises(FlushInOpenTransaction, match="TransactionTestCase"), transaction.atomic():
        flushed({"payload": {"v": 1}})
    assert calls.calls == []
    assert not RegionOutbox.objects.exists()  # rolled back with the error


def test_a_drain_in_the_test_transaction_names_the_ways_out(calls):
    with outbox_context(flush=False):
        RegionOutboxFactory(payload={"v": 1})
    with pytest.raises(CommandError, match="inside an open transaction") as raised:
        call_command("drain_outboxes")
    with pytest.raises(DrainInTransaction) as raised_by_the_engine:
        Drainer(RegionOutbox).drain()
    for message in (str(raised.value), str(raised_by_the_engine.value)):
        assert "outbox.testing.deliver_pending()" in message
        assert "OutboxTestMixin" in message and "transaction=True" in message
    assert deliver_pending() == 1  # the first way out works here
    assert calls.payloads() == [{"v": 1}]


def test_eager_delivery_is_off_again_after_its_block(flushed, calls):
    with eager_delivery(), transaction.atomic():
        flushed({"payload": {"v": 1}})  # delivered inside the test's own transaction
    with pytest.raises(FlushInOpenTransaction), transaction.atomic():
        flushed({"payload": {"v": 2}})
    assert calls.payloads() == [{"v": 1}]


def test_outbox_messages_captures_every_save(outbox_messages):
    with outbox_context(flush=False):
        RegionOutboxFactory(object_identifier=5, payload={"v": 1})
        RegionOutbox.objects.bulk_create(
            [RegionOutbox(**_region_fields(object_identifier=6, payload={"v": 2}))]
        )
        ControlOutboxFactory(object_identifier=9, payload={"v": 3})
    first = outbox_messages.assert_sent_once(Category.AUDIT_EVENT, payload={"v": 1})
    assert first.scope is Scope.ORGANIZATION
    assert first.category is Category.AUDIT_EVENT
    assert (first.object_identifier, first.table, first.using) == (
        5,
        "outbox.RegionOutbox",
        "default",
    )
    assert first.shard.shard_identifier == 1
    outbox_messages.assert_sent(Category.AUDIT_EVENT, object_identifier=6)
    control = outbox_messages.assert_sent_once(Category.USER_UPDATE, table=ControlOutbox)
    assert (control.shard.region_name, control.using) == ("us", "control")
    outbox_messages.assert_not_sent(Category.ORGANIZATION_UPDATE)
    assert len(outbox_messages) == 3


def test_outbox_messages_assertions_explain_what_was_saved(outbox_messages):
    outbox_messages.assert_nothing_sent()
    with pytest.raises(AssertionError, match="saved: none"):
        outbox_messages.assert_sent(Category.AUDIT_EVENT)
    with outbox_context(flush=False):
        RegionOutboxFactory(payload={"v": 1})
        RegionOutboxFactory(payload={"v": 1})
    with pytest.raises(AssertionError, match=r"2 outbox messages, not one.*AUDIT_EVENT"):
        outbox_messages.assert_sent_once(Category.AUDIT_EVENT, payload={"v": 1})
    with pytest.raises(AssertionError, match=r"no outbox message matching .*'v': 2"):
        outbox_messages.assert_sent(Category.AUDIT_EVENT, payload={"v": 2})
    with pytest.raises(AssertionError, match="expected no outbox message"):
        outbox_messages.assert_nothing_sent()


def test_capture_and_eager_delivery_together(outbox_messages, outbox_eager, flushed, calls):
    flushed({"payload": {"v": 1}})
    outbox_messages.assert_sent_once(Category.AUDIT_EVENT, payload={"v": 1})
    assert calls.payloads() == [{"v": 1}]


def test_deliver_pending_delivers_rows_left_to_the_drain(calls):
    with outbox_context(flush=False):
        RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "old"})
        RegionOutboxFactory(shard_identifier=2, payload={"v": "two"})
        RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "new"})
        ControlOutboxFactory(payload={"v": "control"})
    assert deliver_pending() == 3
    assert sorted(p["v"] for p in calls.payloads()) == ["control", "new", "two"]
    assert not RegionOutbox.objects.exists()
    assert not ControlOutbox.objects.exists()
    assert deliver_pending() == 0


@committing
def test_eager_delivery_leaves_committed_flushes_to_the_engine(outbox_eager, calls):
    calls.failing = {7}
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=7)
    row = RegionOutbox.objects.get()  # the real flush ran after commit: logged, kept
    assert row.attempts == 1


def _region_fields(**fields):
    return {
        "shard_scope": Scope.ORGANIZATION,
        "shard_identifier": 1,
        "category": Category.AUDIT_EVENT,
        **fields,
    }
