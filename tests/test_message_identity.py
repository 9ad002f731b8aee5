"""Every message has an identity: `message_id` (stable across retries, unique across
tables and databases) and `attempt` reach receivers, and survive an operator's retry."""

import uuid

from django.db.models.functions import Now
from django.urls import reverse

from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing


def make_due():
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.pending().update(scheduled_for=Now())


def test_the_id_is_stable_across_failed_attempts_and_an_admin_retry(calls, settings, admin_client):
    settings.OUTBOX_MAX_ATTEMPTS = 3
    seen = []

    def fail_three_times(sender, kwargs):
        seen.append((kwargs["message_id"], kwargs["attempt"]))
        if len(seen) <= 3:
            raise RuntimeError("not yet")

    calls.during_call = fail_three_times
    row = RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    assert isinstance(row.message_id, uuid.UUID) and row.message_id.version == 7
    for _ in range(3):
        drain_outboxes()
        make_due()
    dead = RegionOutbox.objects.dead().get()
    assert dead.message_id == row.message_id
    # An operator revives the dead letter from the admin: same message, counted afresh.
    admin_client.post(
        reverse("admin:outbox_regionoutbox_changelist"),
        {"action": "retry_messages", "_selected_action": [dead.pk]},
    )
    assert drain_outboxes().receiver_calls == 1
    once_more = [(row.message_id, 1)]
    assert seen == [(row.message_id, n) for n in (1, 2, 3)] + once_more
    assert calls.calls[0]["message_id"] == row.message_id


def test_coalescing_delivers_the_newest_rows_id(calls):
    rows = [RegionOutboxFactory(shard_identifier=1, object_identifier=1) for _ in range(3)]
    drain_outboxes()
    assert [call["message_id"] for call in calls.calls] == [rows[-1].message_id]
    assert len({row.message_id for row in rows}) == 3


def test_ids_are_distinct_across_tables_and_databases(calls):
    region = RegionOutboxFactory.create_batch(50, shard_identifier=1)
    control = ControlOutboxFactory.create_batch(50)
    other_database = [
        RegionOutbox.objects.using("control").create(
            shard_scope=row.shard_scope,
            shard_identifier=row.shard_identifier,
            category=row.category,
            object_identifier=row.object_identifier,
        )
        for row in region[:50]
    ]
    stored = [
        *RegionOutbox.objects.values_list("message_id", flat=True),
        *ControlOutbox.objects.using("control").values_list("message_id", flat=True),
        *RegionOutbox.objects.using("control").values_list("message_id", flat=True),
    ]
    written = [row.message_id for row in (*region, *control, *other_database)]
    assert sorted(stored) == sorted(written) and len(set(stored)) == 150


def test_operators_find_a_message_by_its_id(calls, settings, admin_client):
    import json
    from io import StringIO

    from django.core.management import call_command

    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1}
    dead = RegionOutboxFactory(shard_identifier=1)
    other = RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    changelist = reverse("admin:outbox_regionoutbox_changelist")
    found = admin_client.get(changelist, {"q": str(dead.message_id)})
    assert [row.pk for row in found.context["cl"].result_list] == [dead.pk]
    assert admin_client.get(changelist, {"q": "not-an-id"}).status_code == 200
    page = admin_client.get(reverse("admin:outbox_regionoutbox_change", args=[dead.pk]))
    assert str(dead.message_id).encode() in page.content
    out = StringIO()
    call_command("outbox_dead_letters", "list", "--json", stdout=out)
    assert [row["message_id"] for row in json.loads(out.getvalue())] == [
        str(dead.message_id),
        str(other.message_id),
    ]
    out = StringIO()
    call_command("outbox_dead_letters", "retry", "--message-id", str(other.message_id), stdout=out)
    assert "Retried 1" in out.getvalue()
    assert RegionOutbox.objects.dead().get().message_id == dead.message_id
