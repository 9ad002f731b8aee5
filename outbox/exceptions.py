"""Every error the app raises on purpose, so callers can catch them by type."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class OutboxError(Exception):
    """Base class of the app's own errors."""


class OutboxConfigurationError(OutboxError, ImproperlyConfigured):
    """Scopes, categories or settings are declared inconsistently."""


class InvalidOutboxMessage(OutboxError, ValueError):
    """An outbox row was refused before anything was written."""


class OutboxContextRequired(OutboxError):
    """An outbox row was saved outside `outbox_context` while OUTBOX_REQUIRE_CONTEXT is on."""


class DrainInTransaction(OutboxError):
    """The engine was asked to drain inside an open transaction.

    Leases only protect anything once committed, so the engine runs its own short
    transactions and refuses to run inside the caller's.
    """


class NoReceiver(OutboxError):
    """A message's category has no connected receiver; the message is kept for later."""
