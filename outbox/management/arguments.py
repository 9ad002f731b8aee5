"""Command-line values shared by the outbox's management commands, checked the same way:
a bad one is a CommandError naming it, never a traceback."""

from __future__ import annotations

import argparse

from django.apps import apps
from django.conf import settings
from django.core.management.base import CommandError

from outbox.models import OutboxBase


def database_alias(alias: str | None) -> str | None:
    """`alias` if DATABASES has it (None stays None: each table's own database)."""
    if alias is not None and alias not in settings.DATABASES:
        raise CommandError(
            f"Unknown database {alias!r} (DATABASES has {list(settings.DATABASES)})."
        )
    return alias


def outbox_table(label: str) -> type[OutboxBase]:
    """The outbox model named `label` (`app_label.Model`)."""
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError) as exc:
        raise CommandError(f"Unknown outbox table {label!r}.") from exc
    if not issubclass(model, OutboxBase):
        raise CommandError(f"{label} is not an outbox table.")
    return model


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {text!r}")
    return value
