"""The dashboard as an operator's first screen at 3 a.m.: every count a link to exactly
what it counts, failing and stuck shards apart from dead letters, a drain hint that is
never false, auto-refresh and a state (word and colour) per line. Rows and leases are
written as the engine leaves them, so these tests do not depend on a failing drain."""

import re
from datetime import timedelta
from urllib.parse import urlsplit

from django.urls import reverse
from django.utils import timezone

from outbox.models import ShardLease
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory, failed_region_row

pytestmark = committing

DASHBOARD = "admin:outbox_dashboard"
LINKED = ["rows", "held", "expired", "backing-off", "retry-due", "failing", "dead"]
LINE = re.compile(r'<tr class="(table-total|scope)[^"]*"(?: data-scope="(\w+)")?>(.*?)</tr>', re.S)
CELL = re.compile(r'<td class="([\w-]+)">(?:<a href="([^"]+)">)?(\d+)')


def lease(identifier, *, token, expires_in, claimed_ago=0, holder="worker-1"):
    now = timezone.now()
    return ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=identifier,
        token=token,
        holder=holder if token else "",
        expires_at=now + timedelta(seconds=expires_in),
        claimed_at=now - timedelta(seconds=claimed_ago),
    )


def dead_row(identifier, attempts=25):
    return RegionOutboxFactory(
        shard_identifier=identifier,
        attempts=attempts,
        last_error="ValueError: poison",
        dead_at=timezone.now(),
    )


def a_bit_of_everything():
    failed_region_row(3)  # failing, backing off
    failed_region_row(5, backoff_minutes=-2)  # failing, retry due
    RegionOutboxFactory(shard_identifier=4)  # pending
    dead_row(7)
    lease(9, token="dead-worker", expires_in=-300)  # expired: stuck
    lease(4, token="live-worker", expires_in=50)  # held


def counts_with_links(page):
    """Per dashboard line (table total or scope): {column: (count, href)}."""
    lines = {}
    for kind, scope, cells in LINE.findall(page):
        other_table = kind == "table-total" and "regionoutbox" not in cells.lower()
        if other_table or (kind == "scope" and not scope):
            continue  # the Region table only, not "No messages."
        lines[scope or kind] = {css: (int(n), href) for css, href, n in CELL.findall(cells)}
    return lines


def test_each_count_links_to_the_list_of_exactly_what_it_counts(admin_client):
    a_bit_of_everything()
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    lines = counts_with_links(page)
    assert set(lines) == {"table-total", "ORGANIZATION"}
    seen = set()
    for line, cells in lines.items():
        for column in LINKED:
            count, href = cells[column]
            assert href, f"{line} {column}: {count} is not a link"
            response = admin_client.get(href.replace("&amp;", "&"))
            assert response.status_code == 200, (line, column, href)
            assert "e=1" not in urlsplit(response.wsgi_request.get_full_path()).query
            assert response.context["cl"].result_count == count, (line, column, href)
            seen.add((column, count))
    # The set-up gives each list something to show.
    assert {("rows", 3), ("held", 1), ("expired", 1), ("backing-off", 1)} <= seen
    assert {("retry-due", 1), ("failing", 2), ("dead", 1)} <= seen


def failing_shards_table(page):
    match = re.search(r'<table class="worst-shards[^"]*".*?</table>', page, re.S)
    assert match, "no failing shards table"
    return match.group(0)


def test_failing_shards_list_live_failing_and_stuck_shards_not_only_dead_letters(admin_client):
    for identifier in range(100, 110):
        dead_row(identifier)  # dead letters with more attempts than any live row
    failed_region_row(3, attempts=2, last_error="RuntimeError: partner down")
    lease(9, token="dead-worker", expires_in=-300, holder="dead-worker")
    lease(
        11, token="slow-worker", expires_in=50, claimed_ago=3600, holder="slow-worker"
    )  # past the deadline
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    table = failing_shards_table(page)
    rows = re.findall(r"<tr class=\"state-(\w+)\">(.*?)</tr>", table, re.S)
    shown = [re.sub(r"<[^>]+>", "|", cells) for _, cells in rows]
    assert "lease expired" in shown[0] and "/9|" in shown[0] and "dead-worker" in shown[0]
    assert "held 1 h 0 min by slow-worker" in shown[1] and "hung call" in shown[1]
    assert "backing off, retried in" in shown[2] and "partner down" in shown[2]
    assert not any("poison" in line for line in shown)  # dead letters are apart
    assert [state for state, _ in rows] == ["failing", "warning", "warning"]
    assert "10 dead letter(s)" in page
    # Each shard links to its rows: the failing shard's pending row (and nobody else's).
    RegionOutboxFactory(shard_identifier=4, object_identifier=3)
    href = re.search(r'<a href="([^"]+)">0/3</a>', table).group(1).replace("&amp;", "&")
    listed = admin_client.get(href).context["cl"].result_list
    assert [(row.shard_identifier, row.attempts) for row in listed] == [(3, 2)]


def test_the_drain_hint_says_what_the_leases_show_and_never_that_no_drain_runs(admin_client):
    # A drain holds a shard (its lease is renewed) yet a retry-due shard is not claimed:
    # the drain runs but is wedged, so "no drain is running" would be false.
    failed_region_row(5, backoff_minutes=-2)
    ShardLease.objects.update(claimed_at=timezone.now() - timedelta(minutes=10))
    lease(4, token="live-worker", expires_in=50, claimed_ago=30)
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "no drain is running;" not in page and "if it stays up" not in page
    drains = re.search(r'<p class="drains" data-table="outbox.RegionOutbox">(.*?)</p>', page, re.S)
    assert drains, "no drain paragraph"
    text = " ".join(re.sub(r"<[^>]+>", "", drains.group(1)).split())
    assert text.startswith("What the leases show:")
    assert "1 shard(s) held now by 1 worker(s)" in text
    assert "Last claim 30 s ago" in text or "Last claim 31 s ago" in text
    assert "1 retry due shard(s), the oldest waiting 2 min" in text
    assert "busy or wedged" in text

    ShardLease.objects.filter(shard_identifier=4).delete()
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "no shard is held now" in page


def test_the_dashboard_refreshes_itself_unless_told_not_to(admin_client):
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert '<meta http-equiv="refresh" content="10">' in page
    assert 'href="?refresh=0"' in page
    quiet = admin_client.get(reverse(DASHBOARD), {"refresh": "0"}).content.decode()
    assert 'http-equiv="refresh"' not in quiet
    assert "Auto-refresh is off" in quiet


def test_each_line_has_a_state_in_words_and_colour(admin_client):
    RegionOutboxFactory(shard_identifier=4)
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert re.search(r'<tr class="table-total state-ok">.*?<td class="state">ok</td>', page, re.S)
    failed_region_row(3)
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert re.search(
        r'<tr class="scope state-warning"[^>]*>.*?<td class="state">warning</td>', page, re.S
    )
    dead_row(7)
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert re.search(
        r'<tr class="scope state-failing"[^>]*>.*?<td class="state">failing</td>', page, re.S
    )
    # Django admin's own colours (its light and dark themes define them).
    for variable in ("--message-success-bg", "--message-warning-bg", "--message-error-bg"):
        assert f"var({variable})" in page


def test_lease_counts_of_a_table_on_another_database_are_no_false_links(admin_client):
    # The lease list reads the default database; ControlOutbox's leases live on "control".
    ControlOutboxFactory()
    ShardLease.objects.using("control").create(
        outbox="outbox.controloutbox",
        shard_scope=1,
        shard_identifier=1,
        token="worker",
        expires_at=timezone.now() + timedelta(seconds=50),
    )
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    control = re.search(r'data-table="outbox.ControlOutbox">(.*?)</tbody>', page, re.S).group(1)
    cells = {css: (int(n), href) for css, href, n in CELL.findall(control)}
    assert cells["held"][0] >= 1 and not cells["held"][1]
    count, href = cells["rows"]
    assert admin_client.get(href.replace("&amp;", "&")).context["cl"].result_count == count
