"""A fake external billing API, so the demo has a receiver that fails for a while.

A successful call is recorded as a WebhookCall (endpoint "billing"). During an outage the
API refuses a set number of calls; the outbox engine reschedules each refused message with
back-off and blocks only that organization's shard until the retry succeeds.
"""

from __future__ import annotations

import threading
from typing import Any

from accounts.models import WebhookCall

ENDPOINT = "billing"


class BillingUnavailable(Exception):
    """The billing API answered 503."""


class FakeBillingAPI:
    """Thread-safe stand-in for the billing service; state is per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refuse_next = 0
        self.refused = 0

    def start_outage(self, calls: int) -> None:
        """Refuse the next `calls` requests, then recover. Resets the `refused` counter."""
        with self._lock:
            self._refuse_next = calls
            self.refused = 0

    def push_organization(self, organization_id: int, state: dict[str, Any] | None) -> None:
        """Send an organization's state (None: cancelled) or raise BillingUnavailable."""
        with self._lock:
            if self._refuse_next > 0:
                self._refuse_next -= 1
                self.refused += 1
                raise BillingUnavailable("billing API answered 503 Service Unavailable")
        WebhookCall.objects.create(endpoint=ENDPOINT, object_id=organization_id, payload=state)


billing_api = FakeBillingAPI()
