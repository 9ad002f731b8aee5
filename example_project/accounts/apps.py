from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Organizations, projects and users, replicated between silos through outboxes."""

    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Receivers are connected here, once the models are loaded: a category without a
        # receiver is an outbox.W001 warning (outbox.E001 under `check --deploy`).
        from accounts.receivers import connect_receivers

        connect_receivers()
