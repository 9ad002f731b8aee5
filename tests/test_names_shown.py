"""Names where numbers were (#35 item 7): one message's admin page and the engine's
failure log lines name the scope and the category, as the change list does; a value no
project enum declares (any more) still shows, as its number with a note."""

import logging

import pytest
from django.urls import reverse

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.test_dead_letters import make_due
from tests.testapp.categories import Category, Scope

pytestmark = committing

FAILURES = ("outbox.delivery_failed", "outbox.dead_lettered")


def detail(client, row):
    response = client.get(reverse("admin:outbox_regionoutbox_change", args=[row.pk]))
    assert response.status_code == 200
    return response.content.decode()


def shown(page, label, value):
    """The read-only field's label and its value, as the admin renders one row's page."""
    return f"<label>{label}:</label>" in page and f'<div class="readonly">{value}</div>' in page


def test_one_messages_page_names_its_scope_and_category(admin_client):
    row = RegionOutboxFactory(shard_identifier=7, category=Category.AUDIT_EVENT)
    page = detail(admin_client, row)
    assert shown(page, "Shard scope", f"ORGANIZATION ({Scope.ORGANIZATION.value})")
    assert shown(page, "Category", f"AUDIT_EVENT ({Category.AUDIT_EVENT.value})")
    # Named once each, where the numbers were, and still not a form.
    assert page.count("<label>Shard scope:</label>") == 1
    assert page.count("<label>Category:</label>") == 1
    assert page.index("Shard scope:") < page.index("Shard identifier:")
    assert 'name="shard_scope"' not in page and 'name="category"' not in page
    assert 'type="submit"' not in page.split('id="content-main"', 1)[1].split("</form>")[0]


def test_a_value_no_longer_declared_still_shows_as_its_number(admin_client):
    row = RegionOutboxFactory(shard_identifier=7, category=Category.AUDIT_EVENT)
    # As a row left behind by a category or scope since removed from the enums.
    RegionOutbox.objects.filter(pk=row.pk).update(shard_scope=50, category=102)
    page = detail(admin_client, row)
    assert shown(page, "Shard scope", "50 (not declared)")
    assert shown(page, "Category", "102 (not declared)")


def failure_records(caplog):
    return [r for r in caplog.records if getattr(r, "event", "") in FAILURES]


def test_failure_and_dead_letter_lines_name_the_scope_and_category(calls, settings, caplog):
    settings.OUTBOX_MAX_ATTEMPTS = 2
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1, object_identifier=9, category=Category.AUDIT_EVENT)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert drain_outboxes().failures == 1
        make_due()
        assert drain_outboxes().dead_lettered == 1
    failed, dead = failure_records(caplog)
    for record, end in ((failed, ", will retry: "), (dead, ", dead-lettered: ")):
        line = record.getMessage()
        assert "shard ORGANIZATION/1 category AUDIT_EVENT object 9 " in line, line
        # The error names the receiver that failed, a lone one too.
        assert (
            end + "tests.testapp.receivers.record: RuntimeError: receiver failed for shard 1"
            in line
        )
        # The numbers stay in the record's fields, as dashboards read them.
        assert (record.scope, record.shard, record.category) == (0, "0/1", 2)
        assert record.object_identifier == 9
    assert (failed.event, dead.event) == FAILURES
    assert (failed.levelname, dead.levelname) == ("WARNING", "ERROR")


@pytest.mark.parametrize("undeclared", ["scope", "category"])
def test_a_failure_of_an_undeclared_value_is_logged_with_its_number(calls, caplog, undeclared):
    calls.failing = {1}  # an undeclared category fails before any receiver is called
    row = RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT)
    change = {"scope": {"shard_scope": 50}, "category": {"category": 102}}[undeclared]
    RegionOutbox.objects.filter(pk=row.pk).update(**change)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert drain_outboxes().failures == 1
    [record] = failure_records(caplog)
    line = record.getMessage()
    if undeclared == "scope":
        assert "shard 50 (not declared)/1 category AUDIT_EVENT object" in line, line
        assert (record.scope, record.shard, record.category) == (50, "50/1", 2)
    else:
        assert "shard ORGANIZATION/1 category 102 (not declared) object" in line, line
        assert (record.scope, record.shard, record.category) == (0, "0/1", 102)


def test_a_rows_title_names_its_scope_and_category():
    row = RegionOutbox(pk=7, shard_scope=0, shard_identifier=1, category=2)
    assert str(row) == "RegionOutbox #7 shard ORGANIZATION/1 category AUDIT_EVENT"
    assert str(RegionOutbox(pk=8, shard_scope=50, shard_identifier=1, category=102)) == (
        "RegionOutbox #8 shard 50/1 category 102"
    )
