"""The audit trail of the admin's actions (#35 item 6): one admin log entry per message an
action changed, naming who, what was done, the message id, its shard and its category, on
the message's History page; written in a number of statements that grows only with the
chunks of rows changed."""

import math
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from outbox.admin.bulk import CHUNK_ROWS
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.test_admin import failed, many_rows, post_action, staff
from tests.testapp.categories import Category

pytestmark = committing

CONTROL = "admin:outbox_controloutbox_changelist"


@pytest.fixture
def operator(django_user_model):
    codenames = ("view_regionoutbox", "change_regionoutbox", "delete_regionoutbox")
    client = staff(django_user_model, "operator", *codenames, "change_shardlease")
    client.user = django_user_model.objects.get(username="operator")
    return client


def entries(model=RegionOutbox):
    """The admin log entries of single messages of `model`: (user, object id, flag,
    message), in the order written."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    logged = LogEntry.objects.filter(content_type=content_type, object_id__isnull=False)
    return [
        (entry.user.username, entry.object_id, entry.action_flag, entry.get_change_message())
        for entry in logged.order_by("pk")
    ]


def said(row, did, shard="ORGANIZATION/3", category="AUDIT_EVENT"):
    return f"{did}: message {row.message_id}, shard {shard}, category {category}."


def test_retrying_one_message_logs_it_under_its_own_object(operator):
    row = failed(3)
    other = failed(3)
    post_action(operator, "retry_messages", [row])
    assert entries() == [("operator", str(row.pk), CHANGE, said(row, "Retried now"))]
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.object_repr == str(row) and entry.user == operator.user
    assert entry.get_admin_url() == reverse("admin:outbox_regionoutbox_change", args=[row.pk])
    assert str(other.pk) not in [object_id for _, object_id, *_ in entries()]


def test_retrying_a_group_logs_every_message_of_the_group(operator):
    target = failed(3, object_identifier=1)
    same_group = failed(3, object_identifier=1)
    failed(3, object_identifier=2)
    post_action(operator, "retry_groups", [target])
    how = "Retried now with its coalescing group"
    assert entries() == [
        ("operator", str(target.pk), CHANGE, said(target, how)),
        ("operator", str(same_group.pk), CHANGE, said(same_group, how)),
    ]


def test_retrying_a_shard_logs_every_message_and_says_which_were_dead_letters(operator):
    target = failed(3, object_identifier=1)
    dead = failed(3, object_identifier=2, dead_at=timezone.now())
    ledger = failed(3, object_identifier=3, category=Category.LEDGER_ENTRY)
    failed(4)
    post_action(operator, "retry_shards", [target])
    assert entries() == [
        ("operator", str(target.pk), CHANGE, said(target, "Retried now with its shard")),
        (
            "operator",
            str(dead.pk),
            CHANGE,
            said(dead, "Retried now (a dead letter, revived) with its shard"),
        ),
        (
            "operator",
            str(ledger.pk),
            CHANGE,
            said(ledger, "Retried now with its shard", category="LEDGER_ENTRY"),
        ),
    ]


def test_discarding_logs_every_message_deleted_and_none_of_a_held_shard(operator):
    target = failed(3, object_identifier=1)
    same_group = failed(3, object_identifier=1)
    alone = failed(4, object_identifier=1)
    held = RegionOutboxFactory(shard_identifier=5, object_identifier=1)
    ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=5,
        token="live",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    post_action(operator, "discard_groups", [target, held])
    post_action(operator, "discard_messages", [alone])
    how = "Discarded with its coalescing group"
    assert entries() == [
        ("operator", str(target.pk), DELETION, said(target, how)),
        ("operator", str(same_group.pk), DELETION, said(same_group, how)),
        ("operator", str(alone.pk), DELETION, said(alone, "Discarded", shard="ORGANIZATION/4")),
    ]
    assert list(RegionOutbox.objects.values_list("pk", flat=True)) == [held.pk]


def test_lifting_a_shards_back_off_logs_its_messages(operator):
    row = failed(3)
    dead = RegionOutboxFactory(shard_identifier=3, dead_at=timezone.now())
    leases = "admin:outbox_shardlease_changelist"
    post_action(operator, "lift_backoff", ShardLease.objects.all(), leases)
    assert entries() == [("operator", str(row.pk), CHANGE, said(row, "Retried now with its shard"))]
    dead.refresh_from_db()
    assert dead.dead_at is not None  # a dead letter stays one: nothing to log


def test_a_message_on_another_database_is_logged_in_the_admin_log(admin_client):
    row = ControlOutboxFactory(region_name="eu", attempts=1)
    post_action(admin_client, "retry_shards", [row], CONTROL)
    shard, category = "eu/USER/1", "USER_UPDATE"
    assert entries(ControlOutbox) == [
        ("admin", str(row.pk), CHANGE, said(row, "Retried now with its shard", shard, category))
    ]
    history = reverse("admin:outbox_controloutbox_history", args=[row.pk])
    assert said(row, "Retried now with its shard", shard, category) in (
        admin_client.get(history).content.decode()
    )


def test_a_messages_history_page_shows_who_retried_it_and_how(operator):
    row = failed(3, object_identifier=1)
    post_action(operator, "retry_messages", [row])
    post_action(operator, "retry_shards", [row])
    page = operator.get(reverse("admin:outbox_regionoutbox_history", args=[row.pk]))
    assert page.status_code == 200
    listed = [
        (entry.user.username, entry.get_change_message()) for entry in page.context["action_list"]
    ]
    assert listed == [
        ("operator", said(row, "Retried now")),
        ("operator", said(row, "Retried now with its shard")),
    ]
    assert said(row, "Retried now with its shard") in page.content.decode()


def statements(client, action, rows):
    """Statements of `action` on every row of the change list (select all)."""
    RegionOutbox.objects.all().delete()
    LogEntry.objects.all().delete()
    many_rows(rows, shards=4 * rows // CHUNK_ROWS)
    first = RegionOutbox.objects.order_by("pk").first()
    client.get(reverse("admin:outbox_regionoutbox_changelist"))  # session, user: alike
    ContentType.objects.clear_cache()
    with CaptureQueriesContext(connections["default"]) as captured:
        post_action(client, action, [first], select_across=True)
    assert len(entries()) == rows  # one entry per message, each chunk fully logged
    return len(captured)


@pytest.mark.parametrize("action", ["retry_messages", "retry_shards", "discard_messages"])
def test_statements_grow_with_the_chunks_of_rows_only(admin_client, action):
    one, two, four = (statements(admin_client, action, n * CHUNK_ROWS) for n in (1, 2, 4))
    per_chunk = two - one
    # A chunk: its read, its UPDATE or DELETE, the INSERT of its entries (which Django
    # splits where SQLite's 999 parameters run out: 142 entries of 7 columns); the rest
    # is the same for any number of rows.
    assert 2 < per_chunk <= 2 + math.ceil(CHUNK_ROWS / 142)
    assert four - two == 2 * per_chunk
