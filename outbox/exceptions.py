"""Every error the app raises on purpose, so callers can catch them by type."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.utils.connection import ConnectionDoesNotExist


class OutboxError(Exception):
    """Base class of the app's own errors."""


class OutboxConfigurationError(OutboxError, ImproperlyConfigured):
    """Scopes, categories or settings are declared inconsistently."""


class MetricsUnavailable(OutboxConfigurationError):
    """OUTBOX_METRICS names an adapter that cannot be loaded: its library is not
    installed, or the path names no Metrics subclass. `problem` says which, `hint` the
    fix; the system check outbox.E018 reports both."""

    def __init__(self, problem: str, hint: str) -> None:
        super().__init__(problem, hint)
        self.problem = problem
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.problem} {self.hint}"


class InvalidOutboxMessage(OutboxError, ValueError):
    """An outbox row was refused before anything was written."""


class UnknownDatabase(OutboxError, ConnectionDoesNotExist):
    """A database alias that DATABASES does not have, given to a reader of the backlog
    (`outbox.health`, `outbox.health.snapshot`); the message names it and the aliases configured,
    as `manage.py outbox_status --database` says. Still a Django
    `ConnectionDoesNotExist`."""

    def __init__(self, alias: str, configured: list[str]) -> None:
        super().__init__(f"Unknown database {alias!r} (DATABASES has {configured}).")
        self.alias = alias
        self.configured = configured


class InvalidThreshold(OutboxError, ValueError):
    """An `outbox.health.Thresholds` limit that is negative or not a number (a count
    that is not a whole number): refused when the Thresholds is made."""


class OutboxContextRequired(OutboxError):
    """An outbox row was saved outside `outbox_context` while OUTBOX_REQUIRE_CONTEXT is on."""


class DrainInTransaction(OutboxError):
    """The engine was asked to drain inside an open transaction.

    Leases only protect anything once committed, so the engine runs its own short
    transactions and refuses to run inside the caller's.
    """

    @classmethod
    def refusing(cls, table: str, using: str) -> DrainInTransaction:
        """The error for a drain of `table` asked for inside a transaction on `using`,
        with the ways out a test has."""
        return cls(
            f"Refusing to drain {table} inside an open transaction on {using!r}: leases "
            "must commit on their own. Drain after commit. In a test, deliver the pending "
            "rows inside the test transaction with outbox.testing.deliver_pending() (or "
            "OutboxTestMixin's deliverOutboxPending()), or commit for real with "
            "TransactionTestCase or pytest.mark.django_db(transaction=True)."
        )


class FlushInOpenTransaction(DrainInTransaction):
    """A synchronous flush ran while its transaction was still open.

    In production on_commit callbacks run after the outermost commit, so this only
    happens under test machinery that runs them early, such as
    `TestCase.captureOnCommitCallbacks(execute=True)`. Where only TestCase's own
    transactions are open the flush delivers inside them instead; this is raised inside
    a transaction the test opened itself, where nothing would have committed yet:
    nothing was delivered. Raised whatever OUTBOX_FLUSH_STRICT says, so such a test
    cannot pass silently.
    """


class NoReceiver(OutboxError):
    """A message's category has no connected receiver; the message is kept for later."""


class RetryLater(OutboxError):
    """Raised by a receiver to have its message delivered again after `delay_seconds`.

    The message is rescheduled after that delay (on the database clock; at least one
    second), not after the back-off curve; it still counts as a failed attempt, so
    OUTBOX_MAX_ATTEMPTS applies. Other receivers of the message still run, and those
    that succeeded are not called again on the retry. Its shard waits meanwhile.
    """

    def __init__(self, delay_seconds: float, message: str = "") -> None:
        if delay_seconds < 0:
            raise ValueError(f"RetryLater needs a delay of 0 seconds or more, not {delay_seconds}")
        self.delay_seconds = float(delay_seconds)
        self.message = message
        super().__init__(message or f"retry in {self.delay_seconds:g} seconds")


class PermanentFailure(OutboxError):
    """Raised by a receiver when its message can never succeed: the message becomes a
    dead letter at once, whatever OUTBOX_MAX_ATTEMPTS says, and its shard goes on with
    its next group. An operator may still retry or discard it
    (`manage.py outbox_dead_letters`)."""

    def __init__(self, message: str = "") -> None:
        self.message = message
        super().__init__(message or "permanent failure")


class StuckReceivers(OutboxError):
    """More receiver calls than OUTBOX_MAX_STUCK_RECEIVERS ran past
    OUTBOX_RECEIVER_TIMEOUT_SECONDS and are still running. Python cannot stop a thread,
    so the drain gives up; `drain_outboxes` exits with status 5 for its supervisor to
    restart the process. Their shards were rescheduled already."""
