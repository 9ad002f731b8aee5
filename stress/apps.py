"""The stress Django app: connects the journaling receiver, the inbox receiver
(`stress/inbox.py`) and the connection registry."""

from __future__ import annotations

from django.apps import AppConfig


class StressConfig(AppConfig):
    name = "stress"
    label = "stress"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from stress import inbox, receivers

        receivers.connect()  # first: the journaling receiver runs before the inbox one
        inbox.connect()
