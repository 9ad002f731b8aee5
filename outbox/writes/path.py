"""The write path the app installs on every outbox table when it is ready.

By default a row saved in `outbox_context` behaves like `Model.save`: it is INSERTed at
`save()` by Django itself, gets its primary key, sends `pre_save` and `post_save` in
order and is visible to the transaction's own queries. Its shard is then recorded for
the flush after commit. Rows are held until the commit instead only where the deferred
writer is on (`outbox.writes.deferred`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from django.db import models

from outbox.models import OutboxBase, WritePath
from outbox.signals import announce_saved
from outbox.writes import context

_Row = TypeVar("_Row", bound=models.Model)


class ContextWritePath(WritePath):
    def save(
        self,
        row: models.Model,
        using: str,
        payload_json: str,
        save_now: Callable[[], None],
        can_hold: bool,
    ) -> None:
        # Only outbox rows come here (`WritePath` names them as models, below them).
        rows = [cast(OutboxBase, row)]
        context.require_context()
        if can_hold and context.hold(rows, [payload_json], using, saved=True):
            return  # written at the commit of the enclosing outbox_context
        save_now()
        context.record_writes(using, rows)
        announce_saved(rows, using)

    def bulk_create(
        self,
        rows: list[_Row],
        using: str,
        payloads_json: list[str],
        create_now: Callable[[], list[_Row]],
        can_hold: bool,
    ) -> list[_Row]:
        context.require_context()
        if can_hold and context.hold(
            cast(list[OutboxBase], rows), payloads_json, using, saved=False
        ):
            return rows  # written at the commit of the enclosing outbox_context
        created = create_now()
        context.record_writes(using, cast(list[OutboxBase], created))
        announce_saved(created, using)
        return created


def install() -> None:
    """Route the saves of every outbox table through this write path."""
    OutboxBase.write_path = ContextWritePath()
