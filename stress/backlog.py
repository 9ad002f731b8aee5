"""The backlog as the runner sees it: rows pending in the outbox, sampled every second."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Backlog:
    """The last count of outbox rows, the largest seen and when (epoch)."""

    rows: int = 0
    largest: int = 0
    at: float = 0.0
    _next: float = 0.0

    def sample(self) -> None:
        from outbox.models import RegionOutbox

        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + 1.0
        self.rows = RegionOutbox.objects.count()
        if self.rows > self.largest:
            self.largest, self.at = self.rows, time.time()
