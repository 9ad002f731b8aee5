"""Database routing: the control silo's tables live on "control", everything else on "default".

"default" plays one region's database. Every table is created on both databases (all
migrations run everywhere), which keeps the example simple; routing decides where rows go.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model

CONTROL_MODELS = frozenset(
    {
        "outbox.controloutbox",
        "accounts.useraccount",
        "accounts.organizationmirror",
        "accounts.projectmirror",
    }
)


class SiloRouter:
    """Send control-side models to the "control" database, the rest to "default"."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return "control" if model._meta.label_lower in CONTROL_MODELS else None

    db_for_write = db_for_read

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        # Relations only exist within one silo; cross-silo links are plain ids.
        return None
