"""The admin operators can trust: permissions, the admin log, names, bounded actions, the
dashboard. Failed rows are written as the engine leaves them (attempts, a back-off in
scheduled_for, a backing-off lease), so these tests do not depend on a failing drain."""

import math
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connections
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from outbox.admin.bulk import CHUNK_ROWS, MAX_KEYS
from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory, failed_region_row
from tests.testapp.categories import Category, Scope

pytestmark = committing

CHANGELIST = "admin:outbox_regionoutbox_changelist"


def failed(shard_identifier, object_identifier=None, **fields):
    if object_identifier is not None:
        fields["object_identifier"] = object_identifier
    return failed_region_row(shard_identifier, **fields)


def staff(django_user_model, username, *codenames):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(django_user_model):
    return staff(django_user_model, "viewer", "view_regionoutbox", "view_shardlease")


@pytest.fixture
def retrier(django_user_model):
    return staff(django_user_model, "retrier", "view_regionoutbox", "change_regionoutbox")


def post_action(client, action, rows, url=CHANGELIST, select_across=False):
    data = {"action": action, "_selected_action": [row.pk for row in rows]}
    if select_across:
        data["select_across"] = "1"
    return client.post(reverse(url), data, follow=True)


def shown(response):
    return [(message.level, str(message)) for message in response.context["messages"]]


def due_now(row):
    row.refresh_from_db()
    return row.scheduled_for <= timezone.now()


def test_a_view_only_user_sees_no_action_and_a_forged_post_changes_nothing(viewer):
    row = failed(3)
    page = viewer.get(reverse(CHANGELIST))
    assert page.status_code == 200 and b"receiver failed" in page.content
    assert b'name="action"' not in page.content
    leases = viewer.get(reverse("admin:outbox_shardlease_changelist"))
    assert leases.status_code == 200 and b'name="action"' not in leases.content
    for action in ("retry_messages", "retry_shards", "discard_messages", "delete_selected"):
        post_action(viewer, action, [row])
    leases = ShardLease.objects.all()
    post_action(viewer, "lift_backoff", leases, "admin:outbox_shardlease_changelist")
    assert not due_now(row) and RegionOutbox.objects.count() == 1
    assert ShardLease.objects.backing_off().count() == 1 and not LogEntry.objects.exists()


def test_retry_needs_change_and_discard_needs_delete_permission(retrier):
    row = failed(3)
    page = retrier.get(reverse(CHANGELIST))
    assert b'value="retry_groups"' in page.content
    assert b'value="discard_messages"' not in page.content
    post_action(retrier, "discard_messages", [row])
    assert RegionOutbox.objects.filter(pk=row.pk).exists()
    post_action(retrier, "retry_messages", [row])
    assert due_now(row) and not ShardLease.objects.exists()


def test_one_row_page_is_read_only_even_for_a_superuser(admin_client):
    row = failed(3)
    change = reverse("admin:outbox_regionoutbox_change", args=[row.pk])
    assert admin_client.get(change).status_code == 200
    assert admin_client.post(change, {"attempts": 0}).status_code == 403
    delete = reverse("admin:outbox_regionoutbox_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert RegionOutbox.objects.get().attempts == 1


def test_every_action_writes_the_admin_log(admin_client):
    rows = [failed(3, object_identifier=7), failed(4, object_identifier=8)]
    post_action(admin_client, "retry_messages", rows[:1])
    post_action(admin_client, "discard_groups", rows[1:])
    third = failed(5)
    leases = ShardLease.objects.all()
    post_action(admin_client, "lift_backoff", leases, "admin:outbox_shardlease_changelist")
    # One entry for each action as a whole (what it did, what it left alone)...
    entries = list(LogEntry.objects.filter(object_id=None).order_by("pk"))
    assert [entry.action_flag for entry in entries] == [CHANGE, DELETION, CHANGE]
    assert entries[0].get_change_message() == ("Retried now: 1 message(s), 1 back-off(s) lifted.")
    assert entries[1].get_change_message() == (
        "Discarded their groups: 1 message(s), 1 back-off(s) lifted."
    )
    assert entries[1].object_repr == "region outbox messages"
    assert entries[2].content_type.model == "shardlease"
    # ...and one for each message it changed (tests/test_admin_audit.py).
    each = LogEntry.objects.exclude(object_id=None).order_by("pk")
    assert [(entry.action_flag, entry.object_id) for entry in each] == [
        (CHANGE, str(rows[0].pk)),
        (DELETION, str(rows[1].pk)),
        (CHANGE, str(third.pk)),
    ]


def test_scopes_and_categories_show_by_name_in_columns_and_filters(admin_client):
    RegionOutboxFactory(category=Category.ORGANIZATION_UPDATE, shard_identifier=1)
    RegionOutboxFactory(category=Category.AUDIT_EVENT, shard_identifier=2)
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert 'field-scope">ORGANIZATION<' in page
    assert 'field-category_name">AUDIT_EVENT<' in page
    assert 'field-category_name">ORGANIZATION_UPDATE<' in page
    assert f'<a href="?category={Category.LEDGER_ENTRY.value}">LEDGER_ENTRY</a>' in page
    assert f'<a href="?shard_scope={Scope.USER.value}">USER</a>' in page
    filtered = admin_client.get(reverse(CHANGELIST) + f"?category={Category.AUDIT_EVENT.value}")
    assert filtered.context["cl"].result_count == 1
    ControlOutboxFactory()
    control = admin_client.get(reverse("admin:outbox_controloutbox_changelist"))
    assert b'field-scope">USER<' in control.content


@pytest.mark.parametrize(
    ("changelist", "parameter"),
    [
        (CHANGELIST, "shard_scope"),
        (CHANGELIST, "category"),
        ("admin:outbox_controloutbox_changelist", "shard_scope"),
        ("admin:outbox_shardlease_changelist", "shard_scope"),
    ],
)
def test_a_filter_value_that_is_no_ascii_integer_is_a_bad_lookup_not_an_error(
    admin_client, changelist, parameter
):
    failed(3)
    url = reverse(changelist)
    # "²" passes str.isdigit() and int() refuses it; int() reads "٣" as 3.
    for value in ("²", "٣", "--3", "3 ", "junk", "1" * 5000):
        response = admin_client.get(url, {parameter: value})
        assert (response.status_code, response["Location"]) == (302, f"{url}?e=1"), value
    assert admin_client.get(url, {parameter: "-0"}).status_code == 200


def test_retry_per_message_group_and_shard(admin_client):
    target = failed(3, object_identifier=1)
    same_group = failed(3, object_identifier=1)
    same_shard = failed(3, object_identifier=2)
    other_shard = failed(4, object_identifier=1)
    post_action(admin_client, "retry_messages", [target])
    assert [due_now(row) for row in (target, same_group, same_shard)] == [True, False, False]
    post_action(admin_client, "retry_groups", [target])
    assert [due_now(row) for row in (same_group, same_shard)] == [True, False]
    post_action(admin_client, "retry_shards", [target])
    assert due_now(same_shard) and not due_now(other_shard)
    assert list(ShardLease.objects.values_list("shard_identifier", flat=True)) == [4]


def test_discard_per_message_and_group_leaves_held_shards_alone(admin_client):
    target = failed(3, object_identifier=1)
    same_group = failed(3, object_identifier=1)
    other_group = failed(3, object_identifier=2)
    held = RegionOutboxFactory(shard_identifier=5, object_identifier=1)
    ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=5,
        token="live",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    post_action(admin_client, "discard_messages", [target])
    assert set(RegionOutbox.objects.values_list("pk", flat=True)) == {
        same_group.pk,
        other_group.pk,
        held.pk,
    }
    response = post_action(admin_client, "discard_groups", [same_group, held])
    assert set(RegionOutbox.objects.values_list("pk", flat=True)) == {other_group.pk, held.pk}
    assert (
        messages.WARNING,
        "1 shard(s) held by a worker right now: left alone. Retry once it has finished with them.",
    ) in shown(response)


def test_discarding_after_the_back_off_ran_out_leaves_no_expired_lease(admin_client):
    # The back-off over, the lease reads as expired; discarding the shard's last message
    # must take it too, or outbox_status --max-expired 0 stays red for good.
    poison = failed(4, object_identifier=1)
    ShardLease.objects.update(expires_at=Now())
    post_action(admin_client, "discard_messages", [poison])
    assert not RegionOutbox.objects.exists()
    assert not ShardLease.objects.exists()


def test_discarding_a_failing_message_lets_its_shard_go_on_at_once(admin_client, calls):
    poison = failed(3, object_identifier=1)
    behind = RegionOutboxFactory(shard_identifier=3, object_identifier=2)
    post_action(admin_client, "discard_messages", [poison])
    assert not ShardLease.objects.exists()  # the back-off went with the failing message
    drain_outboxes()
    assert [call["object_identifier"] for call in calls.calls] == [behind.object_identifier]


def test_an_operator_retry_gets_the_message_delivered(admin_client, calls):
    row = failed(3)
    post_action(admin_client, "retry_shards", [row])
    drain_outboxes()
    assert [call["object_identifier"] for call in calls.calls] == [row.object_identifier]
    assert not RegionOutbox.objects.exists()


def many_rows(count, shards):
    RegionOutbox.objects.bulk_create(
        RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=number % shards,
            category=Category.AUDIT_EVENT,
            object_identifier=number,
            payload={"n": number},
            attempts=1,
            scheduled_for=timezone.now() + timedelta(minutes=5),
        )
        for number in range(count)
    )


def statements(client, action):
    first = RegionOutbox.objects.order_by("pk").first()
    client.get(reverse(CHANGELIST))  # the session and user, loaded alike each time
    ContentType.objects.clear_cache()
    with CaptureQueriesContext(connections["default"]) as captured:
        response = post_action(client, action, [first], select_across=True)
    return len(captured), response


@pytest.mark.parametrize(
    "action",
    ["retry_messages", "retry_groups", "retry_shards", "discard_messages", "discard_groups"],
)
def test_select_all_runs_a_bounded_number_of_statements(admin_client, action):
    many_rows(20, shards=4)
    few, _ = statements(admin_client, action)
    RegionOutbox.objects.all().delete()
    many_rows(3000, shards=2 * MAX_KEYS)
    many, response = statements(admin_client, action)
    # The same statements, but for those of each chunk of rows changed: its read, its
    # UPDATE or DELETE and its admin log entries (tests/test_admin_audit.py).
    changed = int(shown(response)[0][1].split(": ")[1].split(" ")[0])
    assert many - few <= (2 + math.ceil(CHUNK_ROWS / 142)) * math.ceil(changed / CHUNK_ROWS)
    if action in ("retry_groups", "retry_shards", "discard_groups"):
        assert any("Only the first" in text for _, text in shown(response))
    else:
        assert shown(response)[0][1].split(": ")[1].startswith("3000 message(s)")


def test_the_dashboard_shows_backlog_lag_and_lease_states(admin_client):
    failed(3)
    RegionOutboxFactory(shard_identifier=4, category=Category.ORGANIZATION_UPDATE)
    ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=9,
        token="dead-worker",
        expires_at=timezone.now() - timedelta(minutes=5),
    )
    ControlOutboxFactory()
    index = admin_client.get(reverse("admin:index")).content.decode()
    url = reverse("admin:outbox_dashboard")
    assert f'href="{url}"' in index
    page = admin_client.get(url)
    assert page.status_code == 200
    tables = {table["label"]: table for table in page.context["tables"]}
    region, control = tables["outbox.RegionOutbox"], tables["outbox.ControlOutbox"]
    assert (region["rows"], region["shards"], region["failing_rows"]) == (2, 2, 1)
    assert (region["held"], region["expired"], region["backing_off"]) == (0, 1, 1)
    [scope] = region["scopes"]
    assert scope["name"] == "ORGANIZATION" and scope["lag"].endswith(" s")
    assert (control["rows"], control["database"], control["scopes"][0]["name"]) == (
        1,
        "control",
        "USER",
    )
    assert "Expired (stuck)" in page.content.decode()


def test_the_dashboard_needs_a_view_permission(django_user_model, viewer):
    nobody = staff(django_user_model, "nobody")
    assert nobody.get(reverse("admin:outbox_dashboard")).status_code == 403
    assert viewer.get(reverse("admin:outbox_dashboard")).status_code == 200
    index = nobody.get(reverse("admin:index")).content
    assert reverse("admin:outbox_dashboard").encode() not in index


def test_dead_letters_show_their_traceback_and_a_retry_revives_them(admin_client):
    dead = RegionOutboxFactory(
        shard_identifier=3,
        attempts=5,
        dead_at=timezone.now(),
        last_error="RuntimeError: gone",
        last_traceback='Traceback (most recent call last):\n  File "crm.py", line 3',
    )
    RegionOutboxFactory(shard_identifier=4)
    page = admin_client.get(reverse(CHANGELIST) + "?delivery=dead")
    assert page.context["cl"].result_count == 1
    assert b'field-delivery_state">dead<' in page.content
    detail = admin_client.get(reverse("admin:outbox_regionoutbox_change", args=[dead.pk]))
    assert b"File &quot;crm.py&quot;, line 3" in detail.content
    post_action(admin_client, "retry_messages", [dead])
    dead.refresh_from_db()
    assert (dead.dead_at, dead.attempts) == (None, 0) and due_now(dead)


def test_control_outbox_actions_work_on_its_own_database(admin_client):
    due = timezone.now() + timedelta(minutes=5)
    rows = ControlOutboxFactory.create_batch(2, object_identifier=1, attempts=1, scheduled_for=due)
    other = ControlOutboxFactory(region_name="eu", object_identifier=1, scheduled_for=due)
    ShardLease.objects.using("control").create(
        outbox="outbox.controloutbox",
        region_name="us",
        shard_scope=Scope.USER,
        shard_identifier=1,
        expires_at=due,
    )
    url = "admin:outbox_controloutbox_changelist"
    post_action(admin_client, "retry_shards", rows[:1], url)
    assert [due_now(row) for row in (*rows, other)] == [True, True, False]
    assert not ShardLease.objects.using("control").exists()
    post_action(admin_client, "discard_groups", rows[:1], url)
    assert list(ControlOutbox.objects.values_list("pk", flat=True)) == [other.pk]


def test_scheduled_for_is_shown_in_the_time_zone_of_every_other_time(admin_client, settings):
    settings.TIME_ZONE = "America/New_York"  # UTC-5 in January
    row = RegionOutboxFactory(shard_identifier=1)
    RegionOutbox.objects.filter(pk=row.pk).update(
        scheduled_for=datetime(2026, 1, 15, 12, 0, tzinfo=dt_timezone.utc)
    )
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "2026-01-15 07:00:00" in page and "2026-01-15 12:00:00" not in page
