"""Pause and resume from the dashboard in a real browser (#46): an operator pauses a
scope, sees it paused, messages written to it meanwhile wait (neither the flush after
commit nor a drain delivers them), and once resumed all of them are delivered, in order."""

import re

import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import OutboxPause, RegionOutbox
from tests.browser import test_admin_browser
from tests.browser.conftest import missing
from tests.factories import RegionOutboxFactory

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(bool(missing()), reason=missing() or "browser available"),
    pytest.mark.django_db(transaction=True, databases=["default", "control"]),
]

# The admin browser tests' fixture, registered here too: a page opened as a staff user.
open_admin = test_admin_browser.open_admin

DASHBOARD = "/admin/outbox/shardlease/dashboard/?refresh=0"
SCOPE_LINE = 'tbody[data-table="outbox.RegionOutbox"] tr[data-scope="ORGANIZATION"]'


def write(version, *, flush):
    with outbox_context(transaction.atomic(), flush=flush):
        RegionOutboxFactory(shard_identifier=1, payload={"v": version})


def test_an_operator_pauses_a_scope_and_resumes_it_with_nothing_lost(open_admin, calls):
    write(1, flush=False)  # waiting for a drain when the operator arrives
    page = open_admin(DASHBOARD)
    scope = page.locator(SCOPE_LINE)
    assert scope.locator("td.state").inner_text() == "ok"
    scope.get_by_role("button", name="Pause").click()
    page.wait_for_load_state()
    assert "Scope ORGANIZATION of outbox.RegionOutbox paused." in page.inner_text("ul.messagelist")
    scope = page.locator(SCOPE_LINE)
    assert scope.locator("td.state").inner_text() == "paused"
    assert scope.locator("strong.paused").inner_text() == "paused"
    assert page.locator("table.pauses tr.paused-part").inner_text().startswith("scope ORGANIZATION")
    since = page.locator("table.pauses tr.paused-part td.since")
    assert re.fullmatch(r"\d+ s ago", since.inner_text()), since.inner_text()
    assert since.get_attribute("title").startswith(str(OutboxPause.objects.get().paused_at.year))

    write(2, flush=True)  # the flush after commit claims nothing
    write(3, flush=True)
    assert drain_outboxes().receiver_calls == 0  # nor does a drain
    assert calls.calls == []
    page.reload()
    scope = page.locator(SCOPE_LINE)
    assert scope.locator("td.rows").inner_text() == "3"
    assert scope.locator("td.state").inner_text() == "paused"

    scope.get_by_role("button", name="Resume").click()
    page.wait_for_load_state()
    assert "resumed" in page.inner_text("ul.messagelist")
    assert page.locator(SCOPE_LINE).locator("td.state").inner_text() == "ok"
    assert not OutboxPause.objects.exists()
    drain_outboxes()
    assert [call["payload"]["v"] for call in calls.calls] == [1, 2, 3]
    assert not RegionOutbox.objects.exists()


def test_a_view_only_user_is_offered_no_pause(open_admin):
    write(1, flush=False)
    page = open_admin(DASHBOARD, "view_regionoutbox", "view_shardlease", username="viewer")
    scope = page.locator(SCOPE_LINE)
    assert scope.locator("td.rows").inner_text() == "1"
    assert scope.get_by_role("button").count() == 0
    assert page.locator("details.pause-more").count() == 0  # nor a shard's or a category's


def test_an_operator_pauses_one_shard_and_a_category_from_the_dashboards_forms(open_admin, calls):
    page = open_admin(DASHBOARD)
    more = page.locator('details.pause-more[data-table="outbox.RegionOutbox"]')
    more.locator("summary").click()
    shard_form = more.locator("form.pause-shard")
    shard_form.locator('select[name="scope"]').select_option(label="ORGANIZATION")
    shard_form.locator('input[name="shard"]').fill("3")
    shard_form.locator('input[name="reason"]').fill("partner down")
    shard_form.get_by_role("button", name="Pause the shard").click()
    page.wait_for_load_state()
    assert "Shard ORGANIZATION/3 of outbox.RegionOutbox paused." in page.inner_text(
        "ul.messagelist"
    )
    paused = page.locator("table.pauses tr.paused-part")
    assert paused.count() == 1 and paused.inner_text().startswith("shard ORGANIZATION/3")
    assert "partner down" in paused.inner_text()

    for shard in (3, 4):
        with transaction.atomic():
            RegionOutboxFactory(shard_identifier=shard, payload={"v": shard})
    drain_outboxes()
    assert [call["payload"]["v"] for call in calls.calls] == [4]  # shard 3 waits

    more = page.locator('details.pause-more[data-table="outbox.RegionOutbox"]')
    more.locator("summary").click()
    category_form = more.locator("form.pause-category")
    category_form.locator('select[name="category"]').select_option(label="ORGANIZATION_UPDATE")
    category_form.get_by_role("button", name="Pause the category").click()
    page.wait_for_load_state()
    parts = page.locator("table.pauses tr.paused-part")
    assert parts.count() == 2
    assert parts.nth(1).inner_text().startswith("category ORGANIZATION_UPDATE")
    assert OutboxPause.objects.filter(category__isnull=False).count() == 1

    for _ in range(2):  # resume both, from the paused list
        page.locator("table.pauses tr.paused-part").first.get_by_role(
            "button", name="Resume"
        ).click()
        page.wait_for_load_state()
    assert not OutboxPause.objects.exists()
    drain_outboxes()
    assert [call["payload"]["v"] for call in calls.calls] == [4, 3]
