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
