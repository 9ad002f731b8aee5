"""`drain_outboxes --loop`'s heartbeat after its database connection was lost: it says
so once, then reconnects and reports the backlog again (an alert on it keeps working)."""

import io
import threading
import time

from django.core.management import call_command
from django.db import connection, connections

from tests.conftest import committing, server_database_only
from tests.test_bad_input import _server_id

pytestmark = [committing, server_database_only]


def _terminate(victim):
    """From a connection of this thread's own, as a server restart or a proxy would."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            if other.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [victim])
            else:
                cursor.execute(f"KILL CONNECTION {int(victim)}")
    finally:
        other.close()


def test_the_heartbeat_reports_the_backlog_again_after_a_lost_connection(calls, settings):
    settings.OUTBOX_HEARTBEAT_SECONDS = 0.3
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.1
    # The heartbeat runs on the command's waiting thread: this thread, this connection.
    victim = _server_id(connection)
    cutter = threading.Timer(0.8, _terminate, [victim])
    cutter.start()
    out = io.StringIO()
    started = time.monotonic()
    call_command(
        "drain_outboxes",
        "--loop",
        "--max-seconds",
        "3",
        "--progress-every",
        "0",
        verbosity=2,
        stdout=out,
        stderr=io.StringIO(),
    )
    cutter.join(5)
    assert time.monotonic() - started >= 3
    lines = [line for line in out.getvalue().splitlines() if "outbox drain alive" in line]
    unknown = [n for n, line in enumerate(lines) if "database unreachable" in line]
    assert unknown, lines  # the lost connection was seen
    after = lines[unknown[0] + 1 :]
    assert after and all("rows (" in line for line in after), lines  # and read again
