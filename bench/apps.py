"""The bench Django app: connects the trivial receivers and the waiting ones at start-up."""

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    label = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing them connects the receivers.
        from bench import receivers, waiting_receivers  # noqa: F401
