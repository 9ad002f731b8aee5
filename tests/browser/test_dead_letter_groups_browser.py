"""Dead letters grouped by cause in a real browser: headless Chromium against Django's live
server, from the change list to the page of causes and a retry of one cause."""

import pytest
from django.utils import timezone

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from outbox.models.causes import cause_of
from tests.browser import test_admin_browser
from tests.browser.conftest import missing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(bool(missing()), reason=missing() or "browser available"),
    pytest.mark.django_db(transaction=True, databases=["default", "control"]),
]

# The admin browser tests' fixture, registered here too: a page opened as a staff user.
open_admin = test_admin_browser.open_admin

RECORD = "tests.testapp.receivers.record"
CRM_DOWN = f"{RECORD}: RuntimeError: the CRM answered 503 for order {{}}"
BAD_NAME = f"{RECORD}: KeyError: 'name'"


def dead_letter(error, shard_identifier, category=Category.AUDIT_EVENT):
    return RegionOutboxFactory(
        shard_identifier=shard_identifier,
        category=category,
        attempts=3,
        dead_at=timezone.now(),
        last_error=error,
    )


def dead_letters():
    """Three dead letters of one cause (their order numbers differ), one of another."""
    down = [
        dead_letter(CRM_DOWN.format(order), shard) for shard, order in [(1, 17), (2, 23), (3, 99)]
    ]
    other = dead_letter(BAD_NAME, 4, category=Category.ORGANIZATION_UPDATE)
    return down, other


def test_an_operator_finds_the_causes_from_the_change_list_and_retries_one(open_admin, calls):
    down, other = dead_letters()
    page = open_admin("/admin/outbox/regionoutbox/")
    page.get_by_role("link", name="Dead letters by cause").click()
    page.wait_for_load_state()
    assert page.locator("h1").inner_text() == "Dead letters of region outbox messages by cause"
    crm = page.locator(f'tr.cause[data-cause="{cause_of(down[0].last_error).key}"]')
    assert crm.locator("td.count").inner_text() == "3"
    assert crm.locator("td.receiver").inner_text() == RECORD
    assert crm.locator("td.exception").inner_text() == "RuntimeError"
    assert crm.locator("td.message").inner_text() == "the CRM answered <n> for order <n>"
    assert crm.locator("td.categories").inner_text() == "AUDIT_EVENT"
    first, second = page.locator("tr.cause").all()  # the largest cause first
    assert first.get_attribute("data-cause") == crm.get_attribute("data-cause")
    assert second.locator("td.categories").inner_text() == "ORGANIZATION_UPDATE"
    crm.get_by_role("button", name="Retry 3").click()
    page.wait_for_load_state()
    assert "Retried the dead letters of cause" in page.inner_text("ul.messagelist")
    assert page.locator("tr.cause").count() == 1
    drain_outboxes()
    assert sorted(call["object_identifier"] for call in calls.calls) == sorted(
        row.object_identifier for row in down
    )
    assert list(RegionOutbox.objects.all()) == [other]


def test_a_view_only_user_sees_the_causes_without_buttons(open_admin):
    dead_letters()
    page = open_admin(
        "/admin/outbox/regionoutbox/dead-letters/causes/", "view_regionoutbox", username="viewer"
    )
    assert page.locator("tr.cause").count() == 2
    assert page.locator("button[name=verb]").count() == 0
    example = page.locator("tr.cause").first.locator("td.example a").first
    example.click()
    page.wait_for_load_state()
    assert "RuntimeError: the CRM answered 503 for order 17" in page.inner_text("#content")
