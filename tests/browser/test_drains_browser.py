"""The dashboard's live drains in a real browser (#46), against a real `drain_outboxes
--loop` subprocess: a receiver call that hangs is shown in the drain's "Longest call
running" cell with a running time that grows from one page load to the next, and in the
warning colour once it has run LONG_CALL_SECONDS; once the drain is killed (SIGKILL:
nothing deletes its record) and its record has expired, the dashboard no longer lists it
and says "no drain alive".

PostgreSQL and MariaDB only: the subprocess drains the test databases, which on SQLite
are in memory, in this process."""

import re
import signal
import socket

import pytest

from outbox.admin.dashboard import LONG_CALL_SECONDS
from tests.browser import test_admin_browser
from tests.browser.conftest import missing
from tests.conftest import server_database_only
from tests.factories import RegionOutboxFactory
from tests.test_drain_processes import drain_loop
from tests.workers import wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(bool(missing()), reason=missing() or "browser available"),
    pytest.mark.django_db(transaction=True, databases=["default", "control"]),
    server_database_only,
]

# The admin browser tests' fixture, registered here too: a page opened as a staff user.
open_admin = test_admin_browser.open_admin

DASHBOARD = "/admin/outbox/shardlease/dashboard/?refresh=0"
REGION = '[data-table="outbox.RegionOutbox"]'

# The drain's beat: its record expires three beats (1.5 s) after its last one.
BEAT_SECONDS = 0.5


def longest_call_seconds(page, name):
    """The running time the drain's "Longest call running" cell shows after a fresh load
    ("12 s: shard ..."), or None while it shows no call (or the drain is not listed)."""
    page.reload()
    cell = page.locator(f'table.live-drains{REGION} tr[data-drain="{name}"] td.longest-call')
    if not cell.count():
        return None
    shown = re.match(r"(\d+) s: ", cell.inner_text())
    return None if shown is None else int(shown.group(1))


def test_a_hung_call_shows_its_growing_time_and_a_killed_drain_leaves_no_drain_alive(
    open_admin, settings, tmp_path
):
    settings.OUTBOX_DRAIN_BEACON_SECONDS = 10.0  # the live server's view: drains are recorded
    RegionOutboxFactory(shard_identifier=3, payload={"hang": 300})  # its receiver hangs
    drainer = drain_loop(tmp_path, beat_seconds=BEAT_SECONDS, OUTBOX_LOOP_INTERVAL_SECONDS=0.2)
    name = f"{socket.gethostname()}:{drainer.pid}"
    drain_row = f'table.live-drains{REGION} tr[data-drain="{name}"]'
    try:
        page = open_admin(DASHBOARD)
        seen = []

        def call_shown():
            seen.append(longest_call_seconds(page, name))
            return seen[-1] is not None

        wait_until(call_shown, timeout=60, interval=0.5, message=drainer.output())
        first = seen[-1]
        row = page.locator(drain_row)
        assert row.locator("td").first.inner_text() == name
        assert row.locator("td.calls-running").inner_text() == "1"
        cell = row.locator("td.longest-call").inner_text()
        assert "ORGANIZATION/3, category AUDIT_EVENT" in cell, cell

        # Reloaded, the call has run on: a longer time, then the warning colour.
        def ran_long():
            seen.append(longest_call_seconds(page, name))
            return (seen[-1] or 0) >= LONG_CALL_SECONDS

        wait_until(ran_long, timeout=60, interval=0.5, message=f"{seen}\n{drainer.output()}")
        assert seen[-1] > first, seen
        assert "state-warning" in (page.locator(drain_row).get_attribute("class") or "")
        assert not page.locator(f"p.no-drain{REGION}").count()

        drainer.popen.send_signal(signal.SIGKILL)
        drainer.popen.wait(10)

        def gone():
            page.reload()
            return not page.locator(drain_row).count()

        wait_until(gone, timeout=60, interval=0.5, message=drainer.output())
        said = page.locator(f"p.no-drain{REGION}").inner_text()
        assert said.startswith("no drain alive in database default"), said
        assert not page.locator(f"table.live-drains{REGION}").count()
    finally:
        drainer.stop()
