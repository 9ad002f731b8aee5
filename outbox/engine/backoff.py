"""Capped exponential back-off with jitter, for failed rows."""

from __future__ import annotations

import random

from outbox.conf import outbox_settings


def retry_delay(attempt: int) -> float:
    """Seconds to wait before attempt number `attempt + 1`, after `attempt` failures.

    The ceiling doubles per failure up to OUTBOX_BACKOFF_MAX_SECONDS; the delay is drawn
    between half the ceiling and the ceiling, so failed shards do not retry in step.
    """
    base = outbox_settings.BACKOFF_BASE_SECONDS
    cap = outbox_settings.BACKOFF_MAX_SECONDS
    ceiling = min(cap, base * 2 ** min(max(attempt, 1) - 1, 62))
    return random.uniform(ceiling / 2, ceiling)
