"""The stress Django app: connects the journaling receiver, the inbox receiver
(`stress/inbox.py`), the relay of the relay leg (`stress/relay.py`, when the runner asks
for it) and the connection registry."""

from __future__ import annotations

import os

from django.apps import AppConfig


class StressConfig(AppConfig):
    name = "stress"
    label = "stress"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from stress import inbox, receivers

        if os.environ.get("STRESS_RELAY"):  # the relay leg: the relay runs first
            from stress import relay

            relay.connect()
        receivers.connect()  # the journaling receiver runs before the inbox one
        inbox.connect()
