"""`inbox_receiver`: a receiver's writes to the outbox's database are applied once per
message, however often the engine delivers it; the inbox's records are pruned after
their retention, which a check keeps longer than a message can be redelivered."""

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models.functions import Now

from outbox import inbox_receiver, outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.inbox import RECEIVER_NAME_LENGTH, inbox_receivers, prune_inbox
from outbox.models import InboxRecord, RegionOutbox, ShardLease
from outbox.signals import duplicate_skipped, process_region_outbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.models import Delivery

pytestmark = committing


@pytest.fixture
def inbox(calls):
    """An inbox receiver of AUDIT_EVENT journaling its effect (a Delivery row, thread
    'inbox') beside the test app's plain recorder, which journals every call; and the
    duplicates it skipped."""
    skipped = []

    def heard(sender, **kwargs):
        skipped.append(kwargs)
        raise RuntimeError("a listener's bug does not fail the delivery")

    @inbox_receiver(process_region_outbox, sender=Category.AUDIT_EVENT, name="tests.inbox")
    def apply(sender, object_identifier, shard_identifier, payload, **kwargs):
        if hook := apply.during:
            hook(kwargs)
        Delivery.objects.create(
            category=sender,
            shard_identifier=shard_identifier,
            object_identifier=object_identifier,
            payload=payload,
            thread="inbox",
        )

    apply.during = None
    apply.skipped = skipped
    duplicate_skipped.connect(heard)
    yield apply
    duplicate_skipped.disconnect(heard)
    process_region_outbox.disconnect(apply, sender=Category.AUDIT_EVENT)
    inbox_receivers.pop("tests.inbox")


def effects():
    return list(Delivery.objects.filter(thread="inbox").values_list("object_identifier", flat=True))


def test_a_message_delivered_again_after_a_lost_lease_is_applied_once(inbox, calls):
    def lose_the_lease(kwargs):  # commits with the receiver's writes: then the delete fails
        ShardLease.objects.update(token="theirs")

    inbox.during = lose_the_lease
    row = RegionOutboxFactory(
        shard_identifier=1, object_identifier=7, category=Category.AUDIT_EVENT
    )
    assert drain_outboxes().leases_lost == 1
    assert RegionOutbox.objects.count() == 1 and effects() == [7]
    inbox.during = None
    ShardLease.objects.update(expires_at=Now())  # the other worker's lease runs out
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    assert [call["message_id"] for call in calls.calls] == [row.message_id] * 2  # two calls
    assert effects() == [7]  # one effect
    assert [(s["receiver"], s["message_id"]) for s in inbox.skipped] == [
        ("tests.inbox", row.message_id)
    ]
    assert InboxRecord.objects.get().message_id == row.message_id


def test_a_failed_call_rolls_its_record_back_and_the_retry_applies(inbox, calls, settings):
    def fail_once(kwargs):
        if kwargs["attempt"] == 1:
            raise RuntimeError("not yet")

    inbox.during = fail_once
    RegionOutboxFactory(shard_identifier=1, object_identifier=7, category=Category.AUDIT_EVENT)
    drain_outboxes()
    assert effects() == [] and not InboxRecord.objects.exists()
    RegionOutbox.objects.update(scheduled_for=Now())
    ShardLease.objects.update(expires_at=Now())
    drain_outboxes()
    assert effects() == [7] and not inbox.skipped and not RegionOutbox.objects.exists()


def test_new_messages_for_one_object_are_each_applied(inbox, calls):
    for version in range(3):
        with outbox_context(transaction.atomic(), flush=True):  # the synchronous flush
            RegionOutboxFactory(
                shard_identifier=1, object_identifier=7, category=Category.AUDIT_EVENT,
                payload={"v": version},
            )  # fmt: skip
    assert effects() == [7, 7, 7] and InboxRecord.objects.count() == 3


def test_two_workers_racing_for_one_message_apply_it_once(inbox, calls):
    """Two threads deliver the same message on connections of their own: the second
    waits on the first's record, then skips."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer at a time: the race cannot happen there")
    row = RegionOutboxFactory(
        shard_identifier=1, object_identifier=7, category=Category.AUDIT_EVENT
    )
    first_applies = threading.Event()
    inbox.during = lambda kwargs: first_applies.set() or threading.Event().wait(0.3)
    results = []

    def deliver():
        try:
            inbox(
                signal=process_region_outbox, sender=Category.AUDIT_EVENT,
                object_identifier=7, shard_identifier=1, payload=None,
                message_id=row.message_id, attempt=1, headers={}, shard_scope=0, using="default",
            )  # fmt: skip
            results.append("returned")
        finally:
            connections.close_all()

    first = threading.Thread(target=deliver)
    first.start()
    assert first_applies.wait(10)
    inbox.during = None
    second = threading.Thread(target=deliver)
    second.start()
    first.join(10)
    second.join(10)
    assert results == ["returned", "returned"]
    assert effects() == [7] and len(inbox.skipped) == 1


def test_records_are_pruned_after_the_retention_in_slices(inbox, calls, settings):
    audit = Category.AUDIT_EVENT
    RegionOutbox.objects.bulk_create(
        [
            RegionOutboxFactory.build(shard_identifier=n, object_identifier=n, category=audit)
            for n in range(25)
        ]
    )
    drain_outboxes()
    assert InboxRecord.objects.count() == 25
    assert prune_inbox("default", rows=10) == 0  # all younger than the retention
    settings.OUTBOX_INBOX_RETENTION_SECONDS = 3600
    oldest = list(InboxRecord.objects.order_by("pk").values_list("pk", flat=True)[:22])
    InboxRecord.objects.filter(pk__in=oldest).update(date_added=Now() - timedelta(hours=2))
    out = StringIO()
    call_command("outbox_prune_inbox", "--database", "default", "--slice-rows", "10", stdout=out)
    assert "Deleted 22 inbox record(s) older than 3600s from default." in out.getvalue()
    assert InboxRecord.objects.count() == 3


def test_a_retention_shorter_than_redelivery_is_an_error(inbox, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 5
    settings.OUTBOX_BACKOFF_MAX_SECONDS = 600
    settings.OUTBOX_LEASE_SECONDS = 30
    settings.OUTBOX_INBOX_RETENTION_SECONDS = 3000
    (error,) = [m for m in run_checks() if m.id == "outbox.E019"]
    assert "3000 is shorter than a message can be redelivered (3030s" in error.msg
    assert error.hint == "Set OUTBOX_INBOX_RETENTION_SECONDS to at least 3030."
    settings.OUTBOX_INBOX_RETENTION_SECONDS = 3030
    assert not [m for m in run_checks() if m.id == "outbox.E019"]


def test_the_retention_check_follows_each_categorys_own_attempt_limit(inbox, settings, monkeypatch):
    # Every category gives up after 3 attempts whatever OUTBOX_MAX_ATTEMPTS says, so a
    # message can be redelivered for 3 back-offs, not 10: a retention of 500 s is enough.
    settings.OUTBOX_MAX_ATTEMPTS = 10
    settings.OUTBOX_BACKOFF_MAX_SECONDS = 100
    settings.OUTBOX_LEASE_SECONDS = 30
    settings.OUTBOX_INBOX_RETENTION_SECONDS = 500
    monkeypatch.setattr(Category, "max_attempts", lambda self: 3)
    assert not [m for m in run_checks() if m.id == "outbox.E019"]
    # One category that never gives up still counts as one back-off.
    monkeypatch.setattr(
        Category, "max_attempts", lambda self: 0 if self is Category.AUDIT_EVENT else 3
    )
    settings.OUTBOX_INBOX_RETENTION_SECONDS = 300
    (error,) = [m for m in run_checks() if m.id == "outbox.E019"]
    assert "(330s" in error.msg and "times 3 attempt(s)" in error.msg


def test_one_function_stacked_for_two_categories_applies_the_messages_of_both(calls):
    def book(sender, object_identifier, **kwargs):
        Delivery.objects.create(
            category=sender,
            shard_identifier=1,
            object_identifier=object_identifier,
            payload={},
            thread="inbox",
        )

    # As `@inbox_receiver(..., AUDIT_EVENT)` stacked on `@inbox_receiver(..., LEDGER_ENTRY)`.
    ledger = inbox_receiver(process_region_outbox, sender=Category.LEDGER_ENTRY)(book)
    audit = inbox_receiver(process_region_outbox, sender=Category.AUDIT_EVENT)(ledger)
    try:
        RegionOutboxFactory(shard_identifier=1, object_identifier=1, category=Category.AUDIT_EVENT)
        RegionOutboxFactory(shard_identifier=2, object_identifier=2, category=Category.LEDGER_ENTRY)
        drain_outboxes()
        assert not RegionOutbox.objects.exists()
        assert sorted(effects()) == [1, 2]  # neither skipped as the other's duplicate
        assert InboxRecord.objects.count() == 2
    finally:
        process_region_outbox.disconnect(ledger, sender=Category.LEDGER_ENTRY)
        process_region_outbox.disconnect(audit, sender=Category.AUDIT_EVENT)
        inbox_receivers.pop(f"{book.__module__}.{book.__qualname__}")


def test_two_receivers_cannot_share_a_name(inbox):
    with pytest.raises(OutboxConfigurationError, match=r"'tests\.inbox' is taken"):

        @inbox_receiver(process_region_outbox, sender=Category.LEDGER_ENTRY, name="tests.inbox")
        def other(**kwargs):
            pass

    assert inbox_receivers["tests.inbox"] is inbox.inbox_applies


def test_the_name_length_is_the_records(settings):
    field = InboxRecord._meta.get_field("receiver")
    assert field.max_length == RECEIVER_NAME_LENGTH
    with pytest.raises(OutboxConfigurationError, match="over 255 characters"):
        inbox_receiver(process_region_outbox, sender=Category.AUDIT_EVENT, name="x" * 256)(
            lambda **kwargs: None
        )


def test_an_async_receiver_is_refused():
    with pytest.raises(OutboxConfigurationError, match="async def"):

        @inbox_receiver(process_region_outbox, sender=Category.AUDIT_EVENT)
        async def apply(**kwargs):
            pass

    with pytest.raises(OutboxConfigurationError, match="not an OutboxCategory member"):

        @inbox_receiver(process_region_outbox, sender=2)
        def apply_int(**kwargs):
            pass
