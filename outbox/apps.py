from __future__ import annotations

import logging

from django.apps import AppConfig

from outbox.exceptions import OutboxConfigurationError

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
        from outbox.backends.select import after_migrate, commit_with_last_insert
        from outbox.engine.drain import flush_shards
        from outbox.engine.eager import deliver_eagerly
        from outbox.writes import context

        context.install(
            context.LayersAbove(
                flush=flush_shards,
                commit_with_last_insert=commit_with_last_insert,
                flush_in_test_transaction=deliver_eagerly,
            )
        )
        _install_metrics()
        # After every migrate: what each database's backend sets up beyond the tables
        # (PostgreSQL's NOTIFY trigger on each outbox table).
        post_migrate.connect(after_migrate, sender=self, dispatch_uid="outbox.notify_triggers")


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
