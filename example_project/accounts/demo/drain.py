"""Draining until every outbox row is delivered, as a worker or Celery beat would."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from accounts.demo.traffic import pending_rows
from outbox.engine import DrainStats, drain_outboxes

# Pause between rounds that delivered nothing: only backing-off shards are left, and
# their retry time (OUTBOX_BACKOFF_*) has not come yet.
IDLE_PAUSE_SECONDS = 0.05


@dataclass
class DrainReport:
    stats: DrainStats = field(default_factory=DrainStats)
    rounds: int = 0
    seconds: float = 0.0
    left: int = 0  # rows still pending when the drain gave up (0 on success)


def drain_until_empty(timeout: float) -> DrainReport:
    """Call drain_outboxes() until both outbox tables are empty or `timeout` passes.

    Must run outside any transaction, like every drain.
    """
    report = DrainReport()
    started = time.monotonic()
    deadline = started + timeout
    while True:
        stats = drain_outboxes(deadline=deadline)
        report.stats.add(stats)
        report.rounds += 1
        report.left = pending_rows()
        if report.left == 0 or time.monotonic() >= deadline:
            break
        if not stats.receiver_calls:
            time.sleep(IDLE_PAUSE_SECONDS)
    report.seconds = time.monotonic() - started
    return report
