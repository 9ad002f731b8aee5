"""The system check of declared relays (outbox.E023): each relay's own `Relay.check`,
for instance a webhook URL that is not http(s) or a signing secret that does not decode.
A project without relays has none to check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, register

from outbox.relays.base import relays


@register()
def check_relays(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    found: list[CheckMessage] = []
    for relay in list(relays.values()):
        found.extend(relay.check())
    return found
