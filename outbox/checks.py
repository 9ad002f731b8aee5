"""System checks with stable ids: outbox.W001/E001 here, the settings' outbox.E010 and up
in `outbox.checks_settings`. Imported by the app config when it is ready.

A category without a receiver is a warning (outbox.W001) by default, so a project under
construction, or a quick start, can still `migrate`; its messages are kept and retried,
never dropped. `manage.py check --deploy` turns it into an error (outbox.E001), and
`manage.py check --fail-level WARNING` fails on the warning, for CI. Under `--deploy`
both are listed, since a check cannot tell which run it is part of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from outbox.categories import OutboxCategory, registry
from outbox.checks_settings import check_settings
from outbox.models import outbox_models

register(check_settings)


def _unreceived() -> list[OutboxCategory]:
    """Declared categories that no process signal has a receiver for."""
    signals = {model.process_signal for model in outbox_models()}
    return [
        category
        for category in registry.categories.values()
        if not any(signal.has_listeners(category) for signal in signals)
    ]


def _message(category: OutboxCategory) -> str:
    cls = type(category)
    return f"Outbox category {cls.__name__}.{category.name} ({cls.__module__}) has no receiver."


def _hint(category: OutboxCategory) -> str:
    return (
        f"Connect one where Django imports it at start-up (an AppConfig.ready()): "
        f"@receiver(process_region_outbox, sender={type(category).__name__}.{category.name}) "
        f"or process_control_outbox. Messages without a receiver are kept, never deleted, "
        f"and retried with back-off."
    )


@register(Tags.signals)
def check_receivers(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.W001: every declared category needs a receiver, or its messages pile up."""
    return [
        Warning(
            _message(category),
            hint=_hint(category) + " This is an error (outbox.E001) under check --deploy.",
            id="outbox.W001",
        )
        for category in _unreceived()
    ]


@register(Tags.signals, deploy=True)
def check_receivers_deployed(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E001 (check --deploy): a deployed category without a receiver is an error."""
    return [
        Error(_message(category), hint=_hint(category), id="outbox.E001")
        for category in _unreceived()
    ]
