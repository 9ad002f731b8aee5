"""A django-health-check (4.x) check of the outboxes; install the `health` extra.

    # urls.py
    from health_check.views import HealthCheckView

    path("ht/", HealthCheckView.as_view(checks=[
        "health_check.checks.Database",
        ("outbox.integrations.health_check.OutboxHealthCheck",
         {"max_lag_seconds": 300, "max_dead": 0}),
    ]))

The check fails (ServiceUnavailable) when a threshold of `outbox.health` is passed: the
oldest due message waited longer than `max_lag_seconds`, more than `max_dead` dead
letters, more than `max_expired` shards whose lease expired (a dead worker's), and on
PostgreSQL a transaction holding back vacuum for longer than `max_xmin_age_seconds` or
`max_xmin_xids` transaction ids, or more than `max_dead_tuples` dead tuples in an outbox
table or the lease table; and when fewer than `min_drains` drain processes are alive in
a database (`outbox.health.beacon`).
"""

from __future__ import annotations

import dataclasses

from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from outbox.health.thresholds import Thresholds, check


@dataclasses.dataclass
class OutboxHealthCheck(HealthCheck):
    max_lag_seconds: float | None = None
    max_dead: int | None = None
    max_expired: int | None = None
    database: str | None = None
    max_xmin_age_seconds: float | None = None
    max_xmin_xids: int | None = None
    max_dead_tuples: int | None = None
    min_drains: int | None = None

    def run(self) -> None:
        thresholds = Thresholds(
            self.max_lag_seconds,
            self.max_dead,
            self.max_expired,
            max_xmin_age_seconds=self.max_xmin_age_seconds,
            max_xmin_xids=self.max_xmin_xids,
            max_dead_tuples=self.max_dead_tuples,
            min_drains=self.min_drains,
        )
        found = check(self.database, thresholds)
        if found:
            raise ServiceUnavailable("; ".join(found))
