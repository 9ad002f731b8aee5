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
letters, or more than `max_expired` shards whose lease expired (a dead worker's).
"""

from __future__ import annotations

import dataclasses

from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from outbox.health import Thresholds, check


@dataclasses.dataclass
class OutboxHealthCheck(HealthCheck):
    max_lag_seconds: float | None = None
    max_dead: int | None = None
    max_expired: int | None = None
    database: str | None = None

    def run(self) -> None:
        thresholds = Thresholds(self.max_lag_seconds, self.max_dead, self.max_expired)
        found = check(self.database, thresholds)
        if found:
            raise ServiceUnavailable("; ".join(found))
