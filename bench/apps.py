"""The bench Django app: connects the trivial receivers at start-up."""

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    label = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bench import receivers  # noqa: F401  (connects the receivers)
