"""What the admin's audit trail costs: an action over every row of the change list.

    python -m bench.audit --rows 10000 [--repeat 3] [--actions retry_messages,...]

Loads `--rows` failing messages (100 per shard, as many shards as that takes) into
`RegionOutbox` on PostgreSQL, then posts each action through the admin with Django's
test client, as a superuser who ticked one row and chose "select all" (every row of the
change list), and prints the median time of the POST and its statement count (counted in
a run of its own, so that counting does not slow the timed runs). The table is loaded
afresh before every run. Run it on two versions of `outbox` (e.g. with PYTHONPATH
pointing at an older checkout's package first) to compare them.

Its own database (OUTBOX_BENCH_AUDIT_DB, default `outbox_bench_audit`) is created and
migrated at start; PostgreSQL comes from PGHOST, PGPORT, PGUSER, PGPASSWORD.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

ACTIONS = ("retry_messages", "retry_shards", "discard_messages")
PER_SHARD = 100


def load(rows: int) -> None:
    """`rows` failing messages: an attempt made, due in five minutes."""
    from datetime import timedelta

    from django.contrib.admin.models import LogEntry
    from django.utils import timezone

    from bench import shapes
    from bench.db import load_shape, reset
    from outbox.models import RegionOutbox

    reset()
    LogEntry.objects.all().delete()
    load_shape(shapes.ordered_streams(max(1, rows // PER_SHARD), min(rows, PER_SHARD)))
    later = timezone.now() + timedelta(minutes=5)
    RegionOutbox.objects.update(attempts=1, last_error="RuntimeError", scheduled_for=later)


def post(client: Any, action: str) -> Any:
    from django.urls import reverse

    from outbox.models import RegionOutbox

    first = RegionOutbox.objects.order_by("pk").values_list("pk", flat=True).first()
    data = {"action": action, "_selected_action": [first], "select_across": "1"}
    return client.post(reverse("admin:outbox_regionoutbox_changelist"), data)


def run(client: Any, action: str, rows: int, count: bool) -> tuple[float, int]:
    """One POST of `action` over `rows` fresh rows: seconds, and statements when `count`."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    load(rows)
    client.get(reverse("admin:outbox_regionoutbox_changelist"))  # session, user: warm
    if count:
        with CaptureQueriesContext(connection) as captured:
            response = post(client, action)
    started = time.perf_counter()
    if not count:
        response = post(client, action)
    seconds = time.perf_counter() - started
    assert response.status_code == 302, response.status_code
    return seconds, len(captured) if count else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--actions", default=",".join(ACTIONS))
    options = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.audit_settings")
    from django.conf import settings

    from bench.db import create_database, migrate, setup_django

    create_database(settings.AUDIT_DB)
    setup_django()
    migrate()

    from django.contrib.auth.models import User
    from django.test import Client

    import outbox

    client = Client()
    client.force_login(User.objects.create_superuser("bench", "bench@example.com", "pw"))
    print(f"outbox from {os.path.dirname(outbox.__file__)}; {options.rows:,} rows")
    print(f"{'action':<18} {'median s':>9} {'runs s':<24} {'statements':>10}")
    for action in options.actions.split(","):
        times = [run(client, action, options.rows, False)[0] for _ in range(options.repeat)]
        _, statements = run(client, action, options.rows, True)
        runs = " ".join(f"{seconds:.3f}" for seconds in times)
        print(f"{action:<18} {statistics.median(times):>9.3f} {runs:<24} {statements:>10}")


if __name__ == "__main__":
    main()
