"""Pause and resume as an operator does it (#46): `manage.py outbox_pause`, the
dashboard's buttons (permission-checked, a forged POST changes nothing), the admin log of
both, and a paused part shown by `outbox_status`, the dashboard and the gauges."""

import json
from io import StringIO

import pytest
from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from outbox.engine import drain_outboxes
from outbox.metrics.reading import read_table
from outbox.models import ControlOutbox, OutboxPause, PausedPart, RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.test_admin import shown, staff
from tests.testapp.categories import Category, Scope

pytestmark = committing

DASHBOARD = "admin:outbox_dashboard"
PAUSE = "admin:outbox_pause"
ORG = int(Scope.ORGANIZATION)


def pause_command(*args):
    out, err = StringIO(), StringIO()
    call_command("outbox_pause", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def operator(django_user_model):
    return staff(
        django_user_model,
        "operator",
        "view_regionoutbox",
        "view_shardlease",
        "add_outboxpause",
        "delete_outboxpause",
    )


@pytest.fixture
def viewer(django_user_model):
    return staff(django_user_model, "viewer", "view_regionoutbox", "view_shardlease")


def post_pause(client, action, **fields):
    data = {"action": action, "table": "outbox.RegionOutbox", "scope": str(ORG), **fields}
    return client.post(reverse(PAUSE), data)


# -- the command ------------------------------------------------------------------------


def test_the_command_pauses_lists_and_resumes_a_scope_with_an_audit_entry(django_user_model, calls):
    alice = django_user_model.objects.create_user("alice")
    out, err = pause_command(
        "pause", "--scope", "ORGANIZATION", "--table", "outbox.RegionOutbox",
        "--reason", "partner down", "--user", "alice",
    )  # fmt: skip
    assert out == "Paused scope ORGANIZATION of outbox.RegionOutbox.\n" and err == ""
    RegionOutboxFactory(payload={"v": "waits"})
    assert drain_outboxes().receiver_calls == 0
    listed, _ = pause_command("list")
    assert "outbox.regionoutbox scope ORGANIZATION paused since" in listed
    assert listed.rstrip().endswith("by alice: partner down")
    [as_json] = json.loads(pause_command("list", "--json")[0])
    assert (as_json["kind"], as_json["part"]) == ("scope", "scope ORGANIZATION")

    out, _ = pause_command(
        "resume", "--scope", "0", "--table", "outbox.RegionOutbox", "--user", "alice"
    )
    assert out == "Resumed scope ORGANIZATION of outbox.RegionOutbox.\n"
    drain_outboxes()
    assert [call["payload"] for call in calls.calls] == [{"v": "waits"}]
    paused, resumed = LogEntry.objects.order_by("id")
    assert (paused.user_id, paused.action_flag, resumed.action_flag) == (
        alice.pk,
        ADDITION,
        DELETION,
    )
    assert paused.change_message == (
        "Paused scope ORGANIZATION of outbox.regionoutbox by outbox_pause: partner down."
    )
    assert (
        resumed.change_message
        == "Resumed scope ORGANIZATION of outbox.regionoutbox by outbox_pause."
    )


def test_the_command_pauses_every_table_by_default_and_names_shards_and_categories():
    out, err = pause_command("pause", "--category", "user_update", "--no-audit")
    assert out.splitlines() == [
        "Paused category USER_UPDATE of outbox.RegionOutbox.",
        "Paused category USER_UPDATE of outbox.ControlOutbox.",
    ]
    assert err == "" and not LogEntry.objects.exists()
    pause_command("pause", "--scope", "USER", "--shard", "7", "--region", "eu",
                  "--table", "outbox.ControlOutbox", "--no-audit")  # fmt: skip
    parts = {(p.outbox, str(p.part)) for p in OutboxPause.objects.using("control").all()}
    assert ("outbox.controloutbox", "shard eu/USER/7") in parts
    again, _ = pause_command("pause", "--category", "USER_UPDATE", "--no-audit")
    assert again.startswith("Already paused: category USER_UPDATE")
    none, _ = pause_command("resume", "--scope", "ORGANIZATION", "--no-audit")
    assert none.startswith("Was not paused: scope ORGANIZATION")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["pause"], "Say what to pause"),
        (["pause", "--scope", "NOPE"], "Unknown scope 'NOPE'"),
        (["pause", "--category", "AUDIT_EVENT", "--scope", "0"], "--category names a part"),
        (["pause", "--scope", "0", "--region", "eu"], "--region goes with --shard"),
        (["pause", "--scope", "0", "--user", "nobody"], "no user has the username 'nobody'"),
    ],
)
def test_the_command_refuses_what_names_no_part_and_changes_nothing(args, error):
    with pytest.raises(CommandError, match=error):
        pause_command(*args)
    assert not OutboxPause.objects.exists()


def test_without_user_the_command_warns_and_still_pauses(monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "root")
    _, err = pause_command("pause", "--scope", "0", "--table", "outbox.RegionOutbox")
    assert "No admin log entry will be written" in err
    assert OutboxPause.objects.count() == 1 and not LogEntry.objects.exists()


# -- the dashboard ----------------------------------------------------------------------


def test_the_dashboard_pauses_and_resumes_a_scope_with_an_audit_entry(operator, calls):
    RegionOutboxFactory(payload={"v": 1})
    page = operator.get(reverse(DASHBOARD)).content.decode()
    assert 'class="pause-scope"' in page and 'class="resume-scope"' not in page
    response = post_pause(operator, "pause", reason="bad deploy")
    assert response.status_code == 302 and response.url == reverse(DASHBOARD)
    [found] = OutboxPause.objects.all()
    assert (found.part, found.paused_by, found.reason) == (
        PausedPart(ORG),
        "operator",
        "bad deploy",
    )
    assert drain_outboxes().receiver_calls == 0

    page = operator.get(reverse(DASHBOARD)).content.decode()
    assert '<tr class="scope state-paused" data-scope="ORGANIZATION">' in page
    assert '<strong class="paused">paused</strong>' in page
    assert 'class="resume-scope"' in page and 'data-part="scope ORGANIZATION"' in page

    response = post_pause(operator, "resume")
    assert not OutboxPause.objects.exists()
    messages = shown(operator.get(reverse(DASHBOARD)))
    assert any("Scope ORGANIZATION of outbox.RegionOutbox resumed" in text for _, text in messages)
    assert drain_outboxes().receiver_calls == 1
    paused, resumed = LogEntry.objects.order_by("id")
    assert paused.change_message == "Paused scope ORGANIZATION of outbox.regionoutbox: bad deploy."
    assert (resumed.action_flag, resumed.change_message) == (
        DELETION,
        "Resumed scope ORGANIZATION of outbox.regionoutbox.",
    )


def test_the_dashboard_resumes_a_shard_or_category_pause_made_by_the_command(operator):
    pause_command(
        "pause", "--scope", "0", "--shard", "3", "--table", "outbox.RegionOutbox", "--no-audit"
    )
    pause_command(
        "pause", "--category", "LEDGER_ENTRY", "--table", "outbox.RegionOutbox", "--no-audit"
    )
    page = operator.get(reverse(DASHBOARD)).content.decode()
    assert (
        'data-part="shard ORGANIZATION/3"' in page and 'data-part="category LEDGER_ENTRY"' in page
    )
    post_pause(operator, "resume", shard="3", region="")
    post_pause(operator, "resume", category=str(int(Category.LEDGER_ENTRY)))
    assert not OutboxPause.objects.exists()


def test_a_view_only_user_sees_no_button_and_a_forged_post_changes_nothing(viewer):
    RegionOutboxFactory()  # the scope's line is shown, without a button
    page = viewer.get(reverse(DASHBOARD)).content.decode()
    assert 'data-scope="ORGANIZATION"' in page and 'class="pause-scope"' not in page
    assert post_pause(viewer, "pause").status_code == 403
    assert not OutboxPause.objects.exists()
    OutboxPause.objects.create(outbox="outbox.regionoutbox", shard_scope=ORG)
    assert 'class="resume-scope"' not in viewer.get(reverse(DASHBOARD)).content.decode()
    assert post_pause(viewer, "resume").status_code == 403
    assert OutboxPause.objects.count() == 1 and not LogEntry.objects.exists()


def test_pausing_needs_the_table_too_and_a_get_changes_nothing(django_user_model):
    # May pause, but may not view the region table: refused.
    blind = staff(django_user_model, "blind", "view_controloutbox", "add_outboxpause")
    assert post_pause(blind, "pause").status_code == 403
    assert blind.get(reverse(PAUSE), {"action": "pause", "scope": "0"}).status_code == 405
    assert not OutboxPause.objects.exists()


# -- shown everywhere -------------------------------------------------------------------


def test_outbox_status_and_the_gauges_show_what_is_paused():
    pause_command("pause", "--scope", "ORGANIZATION", "--table", "outbox.RegionOutbox",
                  "--reason", "partner down", "--no-audit")  # fmt: skip
    pause_command(
        "pause", "--category", "AUDIT_EVENT", "--table", "outbox.RegionOutbox", "--no-audit"
    )
    RegionOutboxFactory()
    out = StringIO()
    call_command("outbox_status", stdout=out)
    text = out.getvalue()
    assert "expired 0, PAUSED" in text
    assert "    paused: scope ORGANIZATION since " in text and text.count("    paused: ") == 2
    out = StringIO()
    call_command("outbox_status", "--json", stdout=out)
    [table] = [t for t in json.loads(out.getvalue()) if t["table"] == "outbox.RegionOutbox"]
    [scope] = table["scopes"]
    assert (scope["paused"], scope["paused_parts"]) == (True, 2)
    assert [p["part"] for p in table["paused"]] == ["scope ORGANIZATION", "category AUDIT_EVENT"]
    assert read_table(RegionOutbox, None)["ORGANIZATION"].health.paused_parts == 2
    assert "ORGANIZATION" not in read_table(ControlOutbox, None)
