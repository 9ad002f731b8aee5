"""The admin's pages at 1,280 and 1,400 px, the widths of an operator's laptop: the
change list shows `Scheduled for` and `Last error` without cutting them off, and the dead
letters by cause page and the dashboard (with a live drain, a pause and failing shards)
are no wider than the window (headless Chromium against Django's live server)."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from outbox.models.drains import LOOP, record_minute
from tests.browser import test_admin_browser
from tests.browser.conftest import missing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory, failed_region_row
from tests.test_drain_processes import a_drain

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(bool(missing()), reason=missing() or "browser available"),
    pytest.mark.django_db(transaction=True, databases=["default", "control"]),
]

WIDTHS = [1280, 1400]
# Errors as partners send them: long, with URLs and ids no line breaks may split.
ERROR = (
    "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: "
    "https://crm.example.com/api/v2/organizations/8f14e45fceea167a5a36dedd4bea2543/"
    "members?include=roles,permissions,billing_contacts&page_size=500 "
    + "upstream_connect_error_or_disconnect_reset_before_headers "
    * 3
)
TRACEBACK = "Traceback (most recent call last):\n" + "".join(
    f'  File "/srv/app/venv/lib/python3.12/site-packages/crm_client/transport/http.py", '
    f"line {n}, in send_request_with_retries_and_circuit_breaker_{n}\n"
    for n in range(40)
)


def sized(open_admin, path, width):
    page = open_admin(path)
    page.set_viewport_size({"width": width, "height": 900})
    page.reload()
    return page


def right_edge(page, selector):
    return page.eval_on_selector(selector, "e => e.getBoundingClientRect().right")


# The admin browser tests' fixture, registered here too: a page opened as a staff user.
open_admin = test_admin_browser.open_admin


def failing_rows(table):
    for shard in range(1, 6):
        if table == "regionoutbox":
            failed_region_row(shard, attempts=3, last_error=ERROR, object_identifier=10**15 + shard)
        else:
            ControlOutboxFactory(
                region_name="eu-central-1",
                shard_identifier=shard,
                object_identifier=10**15 + shard,
                attempts=3,
                last_error=ERROR,
                scheduled_for=timezone.now() + timedelta(minutes=5),
            )


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("table", ["regionoutbox", "controloutbox"])
def test_the_change_list_shows_scheduled_for_and_last_error(open_admin, table, width):
    failing_rows(table)
    page = sized(open_admin, f"/admin/outbox/{table}/", width)
    results = page.eval_on_selector(
        "#changelist .results",
        "e => [e.scrollWidth, e.clientWidth, e.getBoundingClientRect().right]",
    )
    scroll, client, visible_right = results
    for column in ("th.column-backoff", "th.column-short_error"):
        assert right_edge(page, column) <= visible_right + 1, (column, results)
    assert scroll <= client + 1, results
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dead_letters_by_cause_page_is_no_wider_than_the_window(open_admin, width):
    for shard in range(1, 4):
        RegionOutboxFactory(
            shard_identifier=shard,
            attempts=3,
            dead_at=timezone.now(),
            last_error=f"tests.testapp.receivers.record: {ERROR}{shard}",
            last_traceback=TRACEBACK,
        )
    page = sized(open_admin, "/admin/outbox/regionoutbox/dead-letters/causes/", width)
    assert page.locator("tr.cause").count() >= 1
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dashboard_is_no_wider_than_the_window(open_admin, settings, width):
    settings.OUTBOX_DRAIN_BEACON_SECONDS = 10.0  # drains are recorded: listed
    failing_rows("regionoutbox")
    # A drain on a long host name whose longest call names a long shard and category.
    a_drain(
        "worker-7f9c4d8b6-x2x9q.eu-central-1.compute.internal:4242",
        expires_in=300.0,
        kind=LOOP,
        rows_last_minute=123456,
        calls_running=16,
        stuck_calls=2,
        longest_call_seconds=3725.0,
        longest_call="shard ORGANIZATION/1000000000000001, category ORGANIZATION_UPDATE, "
        "given up at the timeout",
    )
    now = timezone.now().replace(second=0, microsecond=0)
    for minutes_ago in range(60):
        record_minute("default", now - timedelta(minutes=minutes_ago), 60000 + minutes_ago, 2.5)
    reason = "the CRM answers 503 since the deploy of 02:40; ticket OPS-4711 " * 3
    call_command("outbox_pause", "pause", "--scope", "ORGANIZATION", "--reason", reason)
    page = sized(open_admin, "/admin/outbox/shardlease/dashboard/?refresh=0", width)
    assert page.locator("table.failing-shards tr.state-warning").count() == 5
    assert page.locator("table.live-drains tr.drain.state-failing").count() == 1
    assert page.locator("table.pauses tr.paused-part").count() >= 1
    chart = page.locator('figure.activity[data-table="outbox.RegionOutbox"] svg.activity-chart')
    assert chart.locator("rect.bar").count() == 60 and chart.bounding_box()["width"] <= width
    # A scope's name is never broken inside the word.
    scope = page.locator("table.failing-shards td.scope").first
    lines = "cell => { const r = document.createRange(); r.selectNodeContents(cell); "
    lines += "return r.getClientRects().length }"
    assert scope.evaluate(lines) == 1, scope.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
