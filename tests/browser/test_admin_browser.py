"""The admin in a real browser: headless Chromium against Django's live server."""

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from outbox.models.drains import LOOP, record_minute
from tests.browser.conftest import missing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory, failed_region_row
from tests.test_drain_processes import a_drain
from tests.testapp.categories import Category

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(bool(missing()), reason=missing() or "browser available"),
    pytest.mark.django_db(transaction=True, databases=["default", "control"]),
]

# The docs' picture of the dashboard, taken again with OUTBOX_UPDATE_SCREENSHOTS=1 (a
# plain run leaves the tree as it was, and legs side by side never write it at once).
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "admin-dashboard.png"


def failed(shard_identifier, backoff_minutes=5):
    return failed_region_row(
        shard_identifier,
        backoff_minutes=backoff_minutes,
        attempts=2,
        last_error="RuntimeError: the CRM answered 503",
    )


def dead_worker_lease(shard_identifier):
    """The lease of a worker that died five minutes ago, never released."""
    return ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=shard_identifier,
        token="dead-worker",
        holder="web-1:4242:1",
        expires_at=timezone.now() - timedelta(minutes=5),
    )


@pytest.fixture
def open_admin(browser, live_server, django_user_model):
    """Open an admin page as a new staff user with the given permissions (None: a
    superuser); returns the Playwright page."""
    contexts = []

    def open_as(path, *codenames, username="operator"):
        if codenames:
            user = django_user_model.objects.create_user(username, is_staff=True)
            user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
        else:
            user = django_user_model.objects.create_superuser(username, "op@example.com", "pw")
        client = Client()
        client.force_login(user)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        contexts.append(context)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}]
        )
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"{live_server.url}{path}")
        return page

    yield open_as
    for context in contexts:
        context.close()


def test_a_view_only_user_sees_no_action(open_admin):
    failed(3)
    page = open_admin(
        "/admin/outbox/regionoutbox/", "view_regionoutbox", "view_shardlease", username="viewer"
    )
    assert page.locator("td.field-short_error").inner_text().startswith("RuntimeError")
    assert page.locator("select[name=action]").count() == 0
    assert page.locator("input[name=_selected_action]").count() == 0
    page.goto(page.url.replace("regionoutbox", "shardlease"))
    assert page.locator("td.field-state").inner_text() == "backing off"
    assert page.locator("select[name=action]").count() == 0


def test_an_operator_retries_a_backed_off_shard_and_it_is_delivered(open_admin, calls):
    row = failed(3)
    page = open_admin("/admin/outbox/shardlease/")
    assert page.locator("td.field-state").inner_text() == "backing off"
    page.locator("input[name=_selected_action]").first.check()
    page.select_option("select[name=action]", "lift_backoff")
    page.get_by_role("button", name="Go").click()
    page.wait_for_load_state()
    assert "1 shard(s) may be retried now; 1 message(s) due now." in page.inner_text(
        "ul.messagelist"
    )
    drain_outboxes()
    assert [call["object_identifier"] for call in calls.calls] == [row.object_identifier]
    page.goto(page.url.replace("shardlease", "regionoutbox"))
    assert "0 region outbox messages" in page.inner_text("#changelist-form")


def test_a_dead_workers_shard_shows_as_expired(open_admin):
    dead_worker_lease(6)
    page = open_admin("/admin/outbox/shardlease/?state=expired")
    assert page.locator("td.field-shard_identifier").inner_text() == "6"
    assert page.locator("td.field-state").inner_text() == "expired"
    assert page.locator("td.field-scope").inner_text() == "ORGANIZATION"


def test_the_dashboard_renders_its_figures(open_admin, tmp_path, settings):
    settings.OUTBOX_DRAIN_BEACON_SECONDS = 10.0  # drains are recorded: the live one listed
    a_drain(
        "web-2:5151",
        expires_in=300.0,
        kind=LOOP,
        rows_last_minute=1840,
        calls_running=1,
        longest_call_seconds=7.0,  # past LONG_CALL_SECONDS: the warning colour
        longest_call="shard ORGANIZATION/5, category ORGANIZATION_UPDATE",
    )
    failed(3)
    failed(4, backoff_minutes=2)
    dead_worker_lease(6)
    for shard in range(7, 12):
        RegionOutboxFactory(shard_identifier=shard, category=Category.ORGANIZATION_UPDATE)
    ControlOutboxFactory.create_batch(3)
    RegionOutbox.objects.update(date_added=timezone.now() - timedelta(minutes=3))
    # The hour the drains recorded: steady, until the failing shards of the last minutes.
    if timezone.now().second >= 55:  # the page is drawn in the minute written for
        time.sleep(6)
    now = timezone.now().replace(second=0, microsecond=0)
    for ago in range(1, 60):
        rows, lag = (1500 + ago * 37 % 400, 0.4) if ago > 3 else (300 // ago, 60.0 * (4 - ago))
        record_minute("default", now - timedelta(minutes=ago), rows, lag)
    page = open_admin("/admin/")
    page.get_by_role("link", name="Dashboard").first.click()
    page.wait_for_load_state()
    assert page.locator("h1").inner_text() == "Outbox dashboard"
    region = page.locator('tbody[data-table="outbox.RegionOutbox"] tr.table-total')
    assert region.locator("td.rows").inner_text() == "7"
    assert region.locator("td.expired").inner_text() == "1"
    assert region.locator("td.backing-off").inner_text() == "2"
    assert region.locator("td.failing").inner_text() == "2"
    assert region.locator("td.lag").inner_text().startswith("3 min")
    control = page.locator('tbody[data-table="outbox.ControlOutbox"] tr.scope')
    assert control.first.get_attribute("data-scope") == "USER"
    assert control.locator("td.rows").first.inner_text() == "3"
    drain = page.locator('table.live-drains tr[data-drain="web-2:5151"]')
    assert drain.locator("td.longest-call").inner_text().startswith("7 s: shard ORGANIZATION/5")
    assert (
        "no drain alive"
        in page.locator('p.no-drain[data-table="outbox.ControlOutbox"]').inner_text()
    )
    chart = page.locator('figure.activity[data-table="outbox.RegionOutbox"]')
    assert "the busiest minute 1898" in chart.inner_text()
    assert chart.locator("rect.bar").count() == 60 and chart.locator("polyline.lag").count() == 1
    update = os.environ.get("OUTBOX_UPDATE_SCREENSHOTS") == "1"
    shot = SCREENSHOT if update else tmp_path / SCREENSHOT.name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a page was drawn


def test_an_operator_retries_a_dead_letter_and_it_is_delivered(open_admin, calls):
    poison = failed(5)
    RegionOutbox.objects.filter(pk=poison.pk).update(
        dead_at=timezone.now(), last_traceback="Traceback ...\nRuntimeError: poison"
    )
    ShardLease.objects.all().delete()  # a dead letter does not block its shard
    page = open_admin("/admin/outbox/regionoutbox/?delivery=dead")
    assert page.locator("td.field-delivery_state").inner_text() == "dead"
    page.locator("input[name=_selected_action]").first.check()
    page.select_option("select[name=action]", "retry_messages")
    page.get_by_role("button", name="Go").click()
    page.wait_for_load_state()
    assert page.locator("ul.messagelist").count() == 1
    drain_outboxes()
    assert [call["object_identifier"] for call in calls.calls] == [poison.object_identifier]
    page.goto(page.url.split("?")[0])
    assert "0 region outbox messages" in page.inner_text("#changelist-form")
