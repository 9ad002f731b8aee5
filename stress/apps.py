"""The stress Django app: connects the journaling receiver and the connection registry."""

from __future__ import annotations

from django.apps import AppConfig


class StressConfig(AppConfig):
    name = "stress"
    label = "stress"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from stress import receivers

        receivers.connect()
