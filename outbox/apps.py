from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outboxes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Wire the layers: the write path below, the engine and backends above it."""
        from django.db.models.signals import post_migrate

        import outbox.checks  # noqa: F401  (registers the system checks)
        from outbox.backends.postgres_notify import sync_triggers_after_migrate
        from outbox.backends.select import commit_with_last_insert
        from outbox.engine.drain import flush_shards
        from outbox.metrics import install as install_metrics
        from outbox.writes import path
        from outbox.writes.hooks import hooks

        path.install()
        hooks.flush = flush_shards
        hooks.commit_with_last_insert = commit_with_last_insert
        install_metrics()  # connects nothing unless OUTBOX_METRICS is set
        # After every migrate: the NOTIFY trigger on each outbox table (PostgreSQL).
        post_migrate.connect(
            sync_triggers_after_migrate, sender=self, dispatch_uid="outbox.notify_triggers"
        )
