"""Producer models emit their outboxes from every write path, validated, without boilerplate."""

from unittest import mock

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from outbox import outbox_context, unique_object_identifier
from outbox.exceptions import InvalidOutboxMessage
from outbox.models import ControlOutbox, RegionOutbox
from tests.conftest import committing
from tests.testapp.categories import Category
from tests.testapp.models import Account, Organization

pytestmark = committing


def test_save_and_delete_emit_and_flush(calls):
    org = Organization.objects.create(name="acme")
    org.name = "acme 2"
    org.save()
    org_id = org.id
    org.delete()
    assert calls.payloads() == [{"name": "acme"}, {"name": "acme 2"}, None]
    assert {c["object_identifier"] for c in calls.calls} == {org_id}
    assert not RegionOutbox.objects.exists()


def test_writes_inside_flush_false_wait_for_the_drain(calls):
    with outbox_context(flush=False):
        Organization.objects.create(name="later")
    assert calls.calls == []
    assert RegionOutbox.objects.count() == 1


def test_bulk_create_bulk_update_and_update_emit_one_row_per_object(calls):
    with outbox_context(flush=False):
        orgs = Organization.objects.bulk_create([Organization(name=f"o{i}") for i in range(3)])
        assert RegionOutbox.objects.count() == 3
        for org in orgs:
            org.name = org.name.upper()
        Organization.objects.bulk_update(orgs, ["name"])
        assert RegionOutbox.objects.count() == 6
        Organization.objects.filter(name="O1").update(name="renamed")
        newest = RegionOutbox.objects.order_by("-id").first()
        assert newest.payload == {"name": "renamed"}
        Organization.objects.filter(name="O2").delete()
        assert RegionOutbox.objects.order_by("-id").first().payload is None
    assert RegionOutbox.objects.count() == 8


def test_failed_model_write_rolls_back_its_outbox(calls):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        Organization.objects.create(name="doomed")
        raise ZeroDivisionError
    assert not RegionOutbox.objects.exists() and calls.calls == []


def test_control_side_producer_writes_to_its_region(calls):
    with outbox_context(transaction.atomic(using="control"), flush=False):
        Account.objects.create(email="a@example.com", region="eu")
    row = ControlOutbox.objects.get()
    assert (row.region_name, row.category) == ("eu", Category.USER_UPDATE)


def test_unique_object_identifiers_never_coalesce():
    identifiers = {unique_object_identifier() for _ in range(10_000)}
    assert len(identifiers) == 10_000
    assert all(0 < value < 2**63 for value in identifiers)


def test_bulk_create_without_returned_keys_inserts_one_by_one(calls):
    # As on MySQL, whose bulk INSERT returns no keys.
    features = type(connection.features)
    with (
        mock.patch.object(features, "can_return_rows_from_bulk_insert", False),
        outbox_context(flush=False),
    ):
        orgs = Organization.objects.bulk_create([Organization(name=f"o{i}") for i in range(3)])
    assert all(org.pk for org in orgs)
    assert sorted(RegionOutbox.objects.values_list("object_identifier", flat=True)) == sorted(
        org.pk for org in orgs
    )


def test_bulk_create_refuses_rows_it_cannot_announce(calls):
    Organization.objects.create(name="taken", id=1)
    with pytest.raises(InvalidOutboxMessage, match="conflicts are ignored"):
        Organization.objects.bulk_create([Organization(id=1, name="dup")], ignore_conflicts=True)
    assert calls.payloads() == [{"name": "taken"}]
    assert not RegionOutbox.objects.exists()


def test_update_emits_in_batches_for_every_changed_object(calls, monkeypatch):
    from outbox.writes import producers

    monkeypatch.setattr(producers, "UPDATE_BATCH", 2)
    orgs = Organization.objects.bulk_create([Organization(name=f"B{n}") for n in range(5)])
    calls.reset()  # the bulk_create's own messages were flushed at its commit
    with CaptureQueriesContext(connection) as queries:
        assert Organization.objects.filter(name__startswith="B").update(name="batched") == 5
    outbox_insert = f"INSERT INTO {connection.ops.quote_name(RegionOutbox._meta.db_table)}"
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith(outbox_insert)]
    # 5 objects in batches of 2: one bulk insert of their outbox rows per batch.
    assert len(inserts) == (3 if connection.features.can_return_rows_from_bulk_insert else 5)
    # Flushed after the update's commit: one message per object, with its new state.
    assert sorted(c["object_identifier"] for c in calls.calls) == sorted(o.pk for o in orgs)
    assert {p["name"] for p in calls.payloads()} == {"batched"}


def test_default_delete_message_is_the_update_message_with_no_payload(calls):
    # Account does not override outboxes_for_delete(): receivers tell a delete by
    # `payload is None`, on the same shard, category and object as its updates.
    with outbox_context(transaction.atomic(using="control"), flush=False):
        kept, gone, bulk_gone = (
            Account.objects.create(email=f"{name}@example.com") for name in ("k", "g", "b")
        )
        gone_pk, bulk_gone_pk = gone.pk, bulk_gone.pk
        gone.delete()
        Account.objects.filter(pk=bulk_gone_pk).delete()
    deletes = [
        (row.category, row.shard_identifier, row.object_identifier, row.payload)
        for row in ControlOutbox.objects.order_by("id")[3:]
    ]
    assert deletes == [
        (Category.USER_UPDATE, gone_pk, gone_pk, None),
        (Category.USER_UPDATE, bulk_gone_pk, bulk_gone_pk, None),
    ]
    assert kept.outboxes_for_delete()[0].payload is None
    assert kept.outboxes_for_update()[0].payload == {"email": "k@example.com"}


def test_outbox_flush_false_leaves_producers_and_contexts_to_the_drain(calls, settings):
    settings.OUTBOX_FLUSH = False
    Organization.objects.create(name="drained later")
    with outbox_context():  # no transaction needed when nothing is flushed
        Organization.objects.create(name="also later")
    assert calls.calls == [] and RegionOutbox.objects.count() == 2
    # A context that asks for a flush still gets one, and its nested contexts with it.
    with outbox_context(transaction.atomic(), flush=True), outbox_context():
        Organization.objects.create(name="now")
    assert calls.payloads() == [{"name": "now"}]  # its own shard only
    assert RegionOutbox.objects.count() == 2


def test_outbox_flush_is_a_checked_setting(settings):
    from outbox.conf import outbox_settings
    from outbox.exceptions import OutboxConfigurationError

    assert outbox_settings.FLUSH is True
    settings.OUTBOX_FLUSH = "no"
    with pytest.raises(OutboxConfigurationError, match="OUTBOX_FLUSH is 'no'"):
        outbox_settings.FLUSH  # noqa: B018
