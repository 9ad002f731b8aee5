"""Permissions checked per outbox model in every admin view and action (issue #49, item
8): a user sees and acts on an outbox table's messages only with that table's own
permissions, on the dashboard and on the lease list as on the table's pages."""

from datetime import timedelta

from django.contrib import messages
from django.urls import reverse
from django.utils import timezone

from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.models.causes import cause_of
from tests.conftest import committing
from tests.factories import ControlOutboxFactory
from tests.test_admin import due_now, failed, post_action, shown, staff
from tests.test_admin_dead_letter_causes import DOWN
from tests.testapp.categories import Scope

pytestmark = committing

DASHBOARD = "admin:outbox_dashboard"
LEASES = "admin:outbox_shardlease_changelist"
CONTROL = "admin:outbox_controloutbox_changelist"


def failed_control_row(error="KeyError: 'tenant secret'"):
    """A ControlOutbox row as a failed delivery leaves it, with its shard's back-off
    lease, on the database the ControlOutbox table lives on."""
    due = timezone.now() + timedelta(minutes=5)
    row = ControlOutboxFactory(attempts=2, last_error=error, scheduled_for=due)
    ShardLease.objects.using(row._state.db).create(
        outbox="outbox.controloutbox",
        region_name=row.region_name,
        shard_scope=Scope.USER,
        shard_identifier=row.shard_identifier,
        expires_at=due,
    )
    return row


def dashboard_of(client):
    page = client.get(reverse(DASHBOARD))
    labels = [table["label"] for table in page.context["tables"]]
    return labels, page.content.decode()


def test_the_dashboard_shows_each_table_only_to_who_may_view_it(django_user_model):
    failed(3, last_error="RuntimeError: the CRM is down")
    failed_control_row()
    region_viewer = staff(django_user_model, "region", "view_regionoutbox", "view_shardlease")
    labels, html = dashboard_of(region_viewer)
    assert labels == ["outbox.RegionOutbox"] and "the CRM is down" in html
    assert "tenant secret" not in html and 'data-table="outbox.ControlOutbox"' not in html
    control_operator = staff(django_user_model, "control", "change_controloutbox")
    labels, html = dashboard_of(control_operator)
    assert labels == ["outbox.ControlOutbox"] and "tenant secret" in html
    assert "the CRM is down" not in html


def test_the_leases_alone_give_no_dashboard(django_user_model):
    failed(3)
    lease_operator = staff(django_user_model, "leases", "view_shardlease", "change_shardlease")
    assert lease_operator.get(reverse(DASHBOARD)).status_code == 403
    index = lease_operator.get(reverse("admin:index")).content
    assert reverse(DASHBOARD).encode() not in index


def test_retrying_shards_needs_the_change_permission_of_their_table(django_user_model, settings):
    # One database, as many deployments have: the lease list holds ControlOutbox's
    # shards too.
    settings.DATABASE_ROUTERS = []
    region, control = failed(3), failed_control_row()
    scheduled = list(ControlOutbox.objects.values_list("scheduled_for", flat=True))
    codenames = ("view_shardlease", "change_shardlease", "change_regionoutbox")
    operator = staff(django_user_model, "operator", *codenames)
    response = post_action(operator, "lift_backoff", ShardLease.objects.all(), LEASES)
    assert list(ControlOutbox.objects.values_list("scheduled_for", flat=True)) == scheduled
    assert not due_now(region) and ShardLease.objects.backing_off().count() == 2
    assert shown(response) == [
        (
            messages.ERROR,
            "Nothing was retried: you may not change the messages of outbox.controloutbox, "
            "and retrying a shard makes its messages due now. Select only the shards of "
            "tables you may change (filter by outbox) and run the action again.",
        )
    ]
    of_region = ShardLease.objects.of(RegionOutbox)
    post_action(operator, "lift_backoff", of_region, LEASES)
    assert due_now(region) and not due_now(control)
    assert list(ShardLease.objects.values_list("outbox", flat=True)) == ["outbox.controloutbox"]


def test_a_tables_pages_and_actions_need_its_own_permissions(django_user_model):
    codenames = ("view_regionoutbox", "change_regionoutbox", "delete_regionoutbox")
    region_operator = staff(django_user_model, "region", *codenames)
    control = failed_control_row()
    dead = ControlOutboxFactory(attempts=3, dead_at=timezone.now(), last_error=DOWN)
    causes = reverse("admin:outbox_controloutbox_causes")
    assert region_operator.get(reverse(CONTROL)).status_code == 403
    assert region_operator.get(causes).status_code == 403
    for verb in ("retry", "discard"):
        forged = {"verb": verb, "cause": cause_of(DOWN).key}
        assert region_operator.post(causes, forged).status_code == 403
    for action in ("retry_messages", "retry_shards", "discard_messages", "discard_groups"):
        post_action(region_operator, action, [control, dead], CONTROL)
    assert not due_now(control) and ControlOutbox.objects.dead().get() == dead
