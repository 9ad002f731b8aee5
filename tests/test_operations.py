"""What operators use: the admin views and actions, and manage.py outbox_status."""

import io
import json
import re
from datetime import timedelta

import pytest
from django.contrib import messages
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from outbox.engine import Drainer, drain_outboxes
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
    [scope] = region["scopes"]
    assert {key: scope[key] for key in ("scope", "rows", "shards")} == {
        "scope": "ORGANIZATION",
        "rows": 2,
        "shards": 2,
    }
    assert (control["rows"], control["database"]) == (1, "control")
    text = io.StringIO()
    call_command("outbox_status", stdout=text)
    assert "outbox.RegionOutbox (default): 2 rows" in text.getvalue()


def test_admin_lists_messages_and_retries_a_backed_off_shard(admin_client, failed_shard, calls):
    page = admin_client.get(reverse("admin:outbox_regionoutbox_changelist"))
    assert page.status_code == 200
    assert b"receiver failed for shard 3" in page.content
    # The back-off the failed row waits out, read from scheduled_from: 15 to 30 s with
    # OUTBOX_BACKOFF_BASE_SECONDS=30 in the test settings.
    waited = (failed_shard.scheduled_for - failed_shard.scheduled_from).total_seconds()
    assert 14 <= waited <= 31
    assert f"(back-off {waited:.0f}s)".encode() in page.content
    assert admin_client.get(reverse("admin:outbox_shardlease_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:outbox_controloutbox_changelist")).status_code == 200
    response = admin_client.post(
        reverse("admin:outbox_regionoutbox_changelist"),
        {"action": "retry_shards", "_selected_action": [failed_shard.pk]},
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


def lease(identifier, token, minutes):
    """A lease of RegionOutbox shard `identifier`, expiring `minutes` from now."""
    return ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=identifier,
        token=token,
        holder="host:1:1" if token else "",
        expires_at=timezone.now() + timedelta(minutes=minutes),
    )


def lease_states(admin_client, query=""):
    page = admin_client.get(reverse("admin:outbox_shardlease_changelist") + query)
    rows = re.findall(
        r'field-shard_identifier">(\d+)</td>.*?field-state">([^<]*)<', page.content.decode(), re.S
    )
    return {int(identifier): state for identifier, state in rows}


def test_an_expired_lease_is_expired_not_held(admin_client):
    lease(5, "dead-worker", minutes=-5)  # its holder died five minutes ago
    lease(6, "live-worker", minutes=5)
    lease(7, None, minutes=5)
    assert lease_states(admin_client) == {5: "expired", 6: "held", 7: "backing off"}
    assert lease_states(admin_client, "?state=expired") == {5: "expired"}
    assert lease_states(admin_client, "?state=held") == {6: "held"}
    out = io.StringIO()
    call_command("outbox_status", "--json", stdout=out)
    [region] = [t for t in json.loads(out.getvalue()) if t["table"] == "outbox.RegionOutbox"]
    assert (region["leased_shards"], region["backing_off_shards"], region["expired_shards"]) == (
        1,
        1,
        1,
    )


def action_messages(response):
    return [(message.level, str(message)) for message in response.context["messages"]]


def test_retry_now_leaves_a_held_shard_alone_and_says_so(admin_client):
    RegionOutboxFactory(shard_identifier=8)
    assert Drainer(RegionOutbox).reserve(10, "elsewhere").shards
    response = admin_client.post(
        reverse("admin:outbox_regionoutbox_changelist"),
        {"action": "retry_shards", "_selected_action": [RegionOutbox.objects.get().pk]},
        follow=True,
    )
    [success, (level, text)] = action_messages(response)
    assert success == (
        messages.SUCCESS,
        "Retried their shards now: 0 message(s), 0 back-off(s) "
        "lifted; 1 shard(s) held by a worker left alone.",
    )
    assert level == messages.WARNING and "held by a worker" in text
    assert ShardLease.objects.held().count() == 1


def test_lift_backoff_reports_what_it_did(admin_client):
    leases = [lease(1, None, minutes=5), lease(2, "live-worker", minutes=5)]
    leases.append(lease(3, "dead-worker", minutes=-5))
    response = admin_client.post(
        reverse("admin:outbox_shardlease_changelist"),
        {"action": "lift_backoff", "_selected_action": [item.pk for item in leases]},
        follow=True,
    )
    assert action_messages(response) == [
        (messages.SUCCESS, "1 shard(s) may be retried now; 0 message(s) due now."),
        (messages.WARNING, "1 shard(s) held by a worker: left alone."),
        (
            messages.WARNING,
            "1 shard(s) not backing off (expired): nothing to lift, they may be claimed already.",
        ),
    ]
    assert sorted(ShardLease.objects.values_list("shard_identifier", flat=True)) == [2, 3]


def test_status_of_an_unknown_database_is_a_clear_error():
    with pytest.raises(CommandError, match="Unknown database 'nosuch'"):
        call_command("outbox_status", "--database", "nosuch")
