"""(b) This project's drain: `outbox.engine.drain_outboxes()` until the table is empty.

Run in 1 or 2 worker processes at once. Each calls `drain_outboxes()` (all outbox
tables, the configured batch sizes) until no row is left. When another process holds
every remaining shard, it waits and asks again, as a looping drain would: 5 ms, doubling
up to 50 ms while it keeps finding nothing (`manage.py drain_outboxes --loop` waits
OUTBOX_LOOP_INTERVAL_SECONDS, 1 s by default, which would add up to a second of idle
time to a 2-process run). The receivers only count calls (`bench.receivers`). Also used
for the scale test.
"""

from __future__ import annotations

import time
from typing import Any


def run(budget: float) -> dict[str, Any]:
    from bench import receivers
    from outbox.engine import drain_outboxes
    from outbox.engine.pipeline import DrainStats
    from outbox.models import RegionOutbox

    deadline = time.monotonic() + budget
    total = DrainStats()
    passes = idle_passes = idle_streak = 0
    complete = False
    while time.monotonic() < deadline:
        result = drain_outboxes(deadline=deadline)
        total.add(result)
        passes += 1
        if not RegionOutbox.objects.exists():
            complete = True
            break
        if result.rows_retired or result.receiver_calls or result.failures:
            idle_streak = 0
        else:
            idle_passes += 1
            time.sleep(min(0.005 * 2**idle_streak, 0.05))
            idle_streak += 1
    return {
        "rows_retired": total.rows_retired,
        "receiver_calls": receivers.total_calls(),
        "engine_receiver_calls": total.receiver_calls,
        "shards_claimed": total.shards,
        "failures": total.failures,
        "leases_lost": total.leases_lost,
        "passes": passes,
        "idle_passes": idle_passes,
        "complete": complete,
    }
