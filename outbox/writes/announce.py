"""`messages_saved`, sent once outbox rows are written (for metrics and tracing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from outbox.signals import messages_saved

if TYPE_CHECKING:
    from outbox.models import OutboxBase


def announce_saved(rows: Sequence[OutboxBase], using: str) -> None:
    """Send `messages_saved` for rows of one table just written; free without receivers."""
    # `receivers` first: has_listeners looks up the live receivers even when none is
    # connected at all, the usual case, and this runs for every write.
    if rows and messages_saved.receivers and messages_saved.has_listeners(type(rows[0])):
        messages_saved.send(sender=type(rows[0]), rows=list(rows), using=using)
