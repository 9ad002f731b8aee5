from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.apps import AppConfig

from outbox.exceptions import OutboxConfigurationError

if TYPE_CHECKING:
    from outbox.cursors import CommitWithInsert
    from outbox.writes.context import FlushBounds

# The package's name: operators route and silence "outbox.metrics".
logger = logging.getLogger("outbox.metrics")


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outboxes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Wire the layers: the write path below, the engine and backends above it."""
        from django.db.models.signals import post_migrate

        import outbox.checks  # noqa: F401  (registers the system checks)
        from outbox.backends.select import after_migrate
        from outbox.writes import path

        path.install()
        _install_metrics()
        # After every migrate: what each database's backend sets up beyond the tables
        # (PostgreSQL's NOTIFY trigger on each outbox table).
        post_migrate.connect(after_migrate, sender=self, dispatch_uid="outbox.notify_triggers")

    # What the write path asks of the layers above it (`outbox.writes.context.LayersAbove`).

    def flush(self, using: str, bounds: FlushBounds) -> object:
        """Deliver the shards a committed transaction wrote (the synchronous flush)."""
        from outbox.engine.flush import flush_shards

        return flush_shards(using, bounds)

    def commit_with_last_insert(self, using: str) -> CommitWithInsert | None:
        """The database's backend's COMMIT-with-the-last-INSERT, where it has one."""
        from outbox.backends.select import commit_with_last_insert

        return commit_with_last_insert(using)

    def flush_in_test_transaction(self, using: str, bounds: FlushBounds) -> object:
        """Deliver inside `django.test.TestCase`'s transaction (eager delivery)."""
        from outbox.engine.flush import deliver_eagerly

        return deliver_eagerly(using, bounds)


def _install_metrics() -> None:
    """Install what OUTBOX_METRICS names (nothing when it is unset). A bad value, such as
    an adapter whose library is missing, must not stop every command: the process runs
    without metrics, and the system checks (outbox.E011, E012, E018) report it."""
    from outbox.metrics import install

    try:
        install()
    except OutboxConfigurationError as error:
        logger.error(
            "Outbox metrics are off: %s", error, extra={"event": "outbox.metrics_unavailable"}
        )
