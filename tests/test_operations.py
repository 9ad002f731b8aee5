"""What operators use: the admin views and actions, and manage.py outbox_status."""

import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing


@pytest.fixture
def failed_shard(calls):
    calls.failing = {3}
    RegionOutboxFactory(shard_identifier=3)
    drain_outboxes()
    calls.failing = set()
    return RegionOutbox.objects.get()


def test_status_reports_backlog_failures_and_back_off(failed_shard):
    RegionOutboxFactory(shard_identifier=4)
    ControlOutboxFactory()
    out = io.StringIO()
    call_command("outbox_status", "--json", stdout=out)
    region, control = sorted(
        json.loads(out.getvalue()), key=lambda t: t["table"] != "outbox.RegionOutbox"
    )
    assert (region["rows"], region["failing_rows"], region["backing_off_shards"]) == (2, 1, 1)
    assert region["scopes"] == [{"scope": "ORGANIZATION", "rows": 2, "shards": 2}]
    assert (control["rows"], control["database"]) == (1, "control")
    text = io.StringIO()
    call_command("outbox_status", stdout=text)
    assert "outbox.RegionOutbox (default): 2 rows" in text.getvalue()


def test_admin_lists_messages_and_retries_a_backed_off_shard(admin_client, failed_shard, calls):
    page = admin_client.get(reverse("admin:outbox_regionoutbox_changelist"))
    assert page.status_code == 200
    assert b"receiver failed for shard 3" in page.content
    assert admin_client.get(reverse("admin:outbox_shardlease_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:outbox_controloutbox_changelist")).status_code == 200
    response = admin_client.post(
        reverse("admin:outbox_regionoutbox_changelist"),
        {"action": "retry_now", "_selected_action": [failed_shard.pk]},
    )
    assert response.status_code == 302
    assert not ShardLease.objects.exists()
    drain_outboxes()
    assert len(calls.calls) == 1 and not RegionOutbox.objects.exists()


def test_admin_lifts_back_off_from_the_lease_list(admin_client, failed_shard):
    lease = ShardLease.objects.get()
    admin_client.post(
        reverse("admin:outbox_shardlease_changelist"),
        {"action": "lift_backoff", "_selected_action": [lease.pk]},
    )
    assert not ShardLease.objects.exists()
    assert not ControlOutbox.objects.exists()
