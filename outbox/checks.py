"""System checks with stable ids: outbox.E001 here, the settings' outbox.E010 and up in
`outbox.checks_settings`. Imported by the app config when it is ready."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, register

from outbox.categories import registry
from outbox.checks_settings import check_settings
from outbox.models import outbox_models

register(check_settings)


@register(Tags.signals)
def check_receivers(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E001: every declared category needs a receiver, or its messages pile up."""
    signals = {model.process_signal for model in outbox_models()}
    return [
        Error(
            f"Outbox category {type(category).__name__}.{category.name} has no receiver.",
            hint=(
                "Connect one with @receiver(process_region_outbox, sender=...) or "
                "process_control_outbox. Messages without a receiver are kept, never "
                "deleted, and retried with back-off."
            ),
            id="outbox.E001",
        )
        for category in registry.categories.values()
        if not any(signal.has_listeners(category) for signal in signals)
    ]
