from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outboxes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from outbox import checks  # noqa: F401  (registers the system checks)
