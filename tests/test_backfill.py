"""`manage.py outbox_backfill`: the objects that exist before their model had an outbox
(or a category) get their messages, as a save writes them, and the drain delivers them to
the receivers as it does a save's; a run resumes after the last primary key it printed, a
dry run writes nothing, and bad input is refused naming what is valid. The 100k-object
run and its rate are in the bench (`bench/backfill`)."""

import io
import os
import signal
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import models, router
from django.dispatch import receiver

from outbox import outbox_context
from outbox.models import ControlOutbox, RegionOutbox
from outbox.signals import messages_saved
from tests.conftest import committing, server_database_only
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Account, Organization

pytestmark = committing

FIELDS = ("shard_scope", "shard_identifier", "category", "object_identifier", "payload")


def existing(objs):
    """Objects inserted as a project had them before it wrote messages: without any."""
    model = type(objs[0])
    plain = models.QuerySet(model).using(router.db_for_write(model))
    created = plain.bulk_create(objs)
    if created[0].pk is None:  # MySQL returns no keys from a bulk insert
        return list(plain.order_by("pk"))
    return created


def organizations(count):
    return existing([Organization(name=f"org {n}") for n in range(count)])


def backfill(*args, **options):
    """Run the command; its stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    call_command("outbox_backfill", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def drain():
    call_command("drain_outboxes", stdout=io.StringIO(), stderr=io.StringIO())


def fields(row):
    return tuple(getattr(row, name) for name in FIELDS)


def test_existing_objects_get_the_messages_a_save_writes_and_the_drain_delivers_them(calls):
    orgs = organizations(5)
    assert not RegionOutbox.objects.exists()
    out, err = backfill("testapp.Organization", "--category", "ORGANIZATION_UPDATE", batch_size=2)
    rows = list(RegionOutbox.objects.order_by("id"))
    assert [fields(row) for row in rows] == [
        fields(message) for org in orgs for message in org.outboxes_for_update()
    ]
    assert len({row.message_id for row in rows}) == 5
    assert "Backfilled 5 object(s) of testapp.Organization as 5 message(s)" in out
    assert f"Last pk done: {orgs[-1].pk}." in out
    progress = err.splitlines()
    assert len(progress) == 3  # batches of 2, 2 and 1
    assert "5/5 objects 100%, 5 messages written" in progress[-1]
    assert f"last pk {orgs[-1].pk}" in progress[-1]
    drain()
    assert not RegionOutbox.objects.exists()
    assert sorted((c["object_identifier"], c["payload"]["name"]) for c in calls.calls) == [
        (org.pk, org.name) for org in orgs
    ]
    assert all(c["category"] == Category.ORGANIZATION_UPDATE for c in calls.calls)


def test_a_model_on_another_database_is_backfilled_there(calls):
    accounts = existing([Account(email="a@example.com"), Account(email="b@example.com")])
    backfill("testapp.Account", "--all-categories")
    assert not RegionOutbox.objects.exists()
    rows = list(ControlOutbox.objects.using("control").order_by("id"))
    assert [(row.region_name, row.object_identifier) for row in rows] == [
        ("us", account.pk) for account in accounts
    ]
    drain()
    assert [c["payload"]["email"] for c in calls.calls] == ["a@example.com", "b@example.com"]


def test_after_resumes_past_the_last_primary_key_done():
    orgs = organizations(5)
    out, _ = backfill(
        "testapp.Organization", "--category", "1", "--after", str(orgs[1].pk), verbosity=0
    )
    assert out == ""
    assert sorted(RegionOutbox.objects.values_list("object_identifier", flat=True)) == [
        org.pk for org in orgs[2:]
    ]


def test_a_stopped_run_resumes_where_it_printed_and_delivers_every_object_once(calls):
    """SIGTERM during the first batch: that batch commits, the run stops (status 0) and
    says where to resume; the resumed run writes the rest, and nothing twice."""
    orgs = organizations(5)

    @receiver(messages_saved, sender=RegionOutbox, weak=False)
    def stop_at_first_batch(**kwargs):
        messages_saved.disconnect(stop_at_first_batch, sender=RegionOutbox)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        out, _ = backfill(
            "testapp.Organization", "--category", "ORGANIZATION_UPDATE", "--batch-size", "2"
        )
    finally:
        messages_saved.disconnect(stop_at_first_batch, sender=RegionOutbox)
    assert f"Resume with --after {orgs[1].pk}" in out
    assert RegionOutbox.objects.count() == 2
    out, _ = backfill(
        "testapp.Organization", "--category", "ORGANIZATION_UPDATE", "--after", str(orgs[1].pk)
    )
    assert "Backfilled 3 object(s)" in out
    drain()
    assert sorted(c["object_identifier"] for c in calls.calls) == [org.pk for org in orgs]


def test_a_second_run_coalesces_with_the_first_one_call_per_object(calls):
    orgs = organizations(3)
    with outbox_context(flush=False):  # a save's message, left to the drain
        Organization.objects.filter(pk=orgs[0].pk).update(name="renamed")
    backfill("testapp.Organization", "--category", "ORGANIZATION_UPDATE")
    backfill("testapp.Organization", "--category", "ORGANIZATION_UPDATE")
    assert RegionOutbox.objects.count() == 7
    drain()
    assert sorted((c["object_identifier"], c["payload"]["name"]) for c in calls.calls) == [
        (orgs[0].pk, "renamed"),
        (orgs[1].pk, "org 1"),
        (orgs[2].pk, "org 2"),
    ]


def test_flush_delivers_each_batch_from_the_command(calls):
    organizations(3)
    backfill("testapp.Organization", "--category", "ORGANIZATION_UPDATE", "--flush")
    assert not RegionOutbox.objects.exists()
    assert len(calls.calls) == 3


def test_a_dry_run_counts_and_writes_nothing():
    orgs = organizations(3)
    out, err = backfill("testapp.Organization", "--all-categories", "--dry-run", batch_size=2)
    assert "Dry run: would write 3 object(s) of testapp.Organization as 3 message(s)" in out
    assert "Nothing was written." in out
    assert "3/3 objects 100%, 3 messages would write" in err
    assert not RegionOutbox.objects.exists()
    assert Organization.objects.count() == len(orgs)


def test_a_message_validation_refuses_stops_at_its_batch_naming_the_object(settings):
    settings.OUTBOX_MAX_PAYLOAD_BYTES = 40
    orgs = existing([Organization(name=name) for name in ["a", "b", "x" * 60, "d"]])
    with pytest.raises(CommandError) as caught:
        backfill("testapp.Organization", "--category", "ORGANIZATION_UPDATE", batch_size=2)
    message = str(caught.value)
    assert f"testapp.Organization object pk {orgs[2].pk}:" in message
    assert f"Resume with --after {orgs[1].pk}" in message
    assert sorted(RegionOutbox.objects.values_list("object_identifier", flat=True)) == [
        orgs[0].pk,
        orgs[1].pk,
    ]  # the first batch committed, the second rolled back


def test_a_dry_run_finds_the_message_validation_refuses(settings):
    settings.OUTBOX_MAX_PAYLOAD_BYTES = 40
    orgs = existing([Organization(name="a"), Organization(name="x" * 60)])
    with pytest.raises(CommandError, match=f"object pk {orgs[1].pk}:"):
        backfill("testapp.Organization", "--all-categories", "--dry-run")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["testapp.Nope", "--all-categories"], "Unknown model 'testapp.Nope'; the models "
         "that write their own messages are testapp.Account, testapp.Organization."),
        (["nodot", "--all-categories"], "Unknown model 'nodot'"),
        (["testapp.Delivery", "--all-categories"], "testapp.Delivery has no "
         "outboxes_for_update() (it is not an OutboxProducer); the models"),
        (["outbox.RegionOutbox", "--all-categories"], "outbox.RegionOutbox has no"),
        (["testapp.Organization", "--category", "NOPE"], "Unknown category 'NOPE'; the "
         "categories are ORGANIZATION_UPDATE (1), AUDIT_EVENT (2), USER_UPDATE (3)"),
        (["testapp.Organization", "--all-categories", "--after", "abc"], "--after 'abc' is "
         "not a primary key of testapp.Organization"),
        (["testapp.Organization", "--all-categories", "--batch-size", "0"], "--batch-size "
         "must be a whole number of 1 or more, not 0."),
        (["testapp.Organization", "--all-categories", "--max-pending", "-1"], "--max-pending"),
        (["testapp.Organization", "--all-categories", "--database", "nope"], "Unknown "
         "database 'nope'"),
        (["testapp.Organization"], "one of the arguments --category --all-categories is "
         "required"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_what_is_valid(args, expected):
    organizations(2)
    with pytest.raises(CommandError) as caught:
        backfill(*args)
    assert expected in str(caught.value)
    assert not RegionOutbox.objects.exists()


def test_a_category_the_model_does_not_write_is_refused_before_anything_is_written():
    organizations(2)
    with pytest.raises(CommandError) as caught:
        backfill("testapp.Organization", "--category", "USER_UPDATE")
    assert str(caught.value) == (
        "testapp.Organization.outboxes_for_update() returns no message of USER_UPDATE for "
        "its first objects: its messages are of ORGANIZATION_UPDATE (1). Add the category "
        "to outboxes_for_update() first, or backfill one of those. Nothing was written."
    )
    assert not RegionOutbox.objects.exists()


def test_no_objects_is_no_error():
    out, err = backfill("testapp.Organization", "--all-categories")
    assert "Backfilled 0 object(s)" in out and err == ""


@server_database_only
def test_max_pending_writes_a_batch_only_once_the_drain_caught_up(calls, settings):
    """Each batch is written only while no more than --max-pending messages wait; a
    drain running beside it delivers everything."""
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    orgs = organizations(8)
    backlog_at_writes = []

    @receiver(messages_saved, sender=RegionOutbox, weak=False)
    def pending_before(rows, using, **kwargs):
        # In the batch's transaction: committed rows of earlier batches, and its own.
        backlog_at_writes.append(RegionOutbox.objects.using(using).count() - len(rows))

    done = threading.Event()

    def run_drain():
        try:
            while not done.is_set():
                drain()
        finally:
            from django.db import connections

            connections.close_all()

    drainer = threading.Thread(target=run_drain)
    drainer.start()
    try:
        backfill("testapp.Organization", "--all-categories", "--batch-size", "2",
                 "--max-pending", "1")  # fmt: skip
    finally:
        done.set()
        drainer.join()
        messages_saved.disconnect(pending_before, sender=RegionOutbox)
    drain()
    assert len(backlog_at_writes) == 4 and max(backlog_at_writes) <= 1
    assert sorted({c["object_identifier"] for c in calls.calls}) == [org.pk for org in orgs]


def test_the_messages_name_the_scope_of_their_category():
    [org] = organizations(1)
    backfill("testapp.Organization", "--category", str(int(Category.ORGANIZATION_UPDATE)))
    row = RegionOutbox.objects.get()
    assert (row.shard_scope, row.shard_identifier) == (Scope.ORGANIZATION, org.pk)
