"""A message's History page in a real browser: an operator retries a message in the admin
(headless Chromium against Django's live server), then finds the entry on its History
page: who, and what was done to which message."""

import pytest

from tests.browser import test_admin_browser
from tests.browser.conftest import missing
from tests.browser.test_admin_browser import failed

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(bool(missing()), reason=missing() or "browser available"),
    pytest.mark.django_db(transaction=True, databases=["default", "control"]),
]

# The fixture that opens an admin page as a new staff user, shared with the admin's tests.
open_admin = test_admin_browser.open_admin


def test_a_retried_messages_history_page_shows_who_retried_it(open_admin):
    row = failed(3)
    failed(4)
    page = open_admin(
        "/admin/outbox/regionoutbox/",
        "view_regionoutbox",
        "change_regionoutbox",
        username="night-operator",
    )
    page.locator(f"input[name=_selected_action][value='{row.pk}']").check()
    page.select_option("select[name=action]", "retry_messages")
    page.get_by_role("button", name="Go").click()
    page.wait_for_load_state()
    assert "Retried now: 1 message(s)" in page.inner_text("ul.messagelist")
    page.goto(page.url.split("?")[0] + f"{row.pk}/change/")
    page.get_by_role("link", name="History").click()
    page.wait_for_load_state()
    assert page.locator("h1").inner_text() == f"Change history: {row}"
    [entry] = page.locator("#change-history tbody tr").all()
    cells = [cell.inner_text() for cell in entry.locator("th, td").all()]
    assert cells[1:] == [
        "night-operator",
        f"Retried now: message {row.message_id}, shard ORGANIZATION/3, category AUDIT_EVENT.",
    ]
