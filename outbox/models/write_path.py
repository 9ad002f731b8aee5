"""The seam between an outbox row's save and the write path that writes it.

A row validates itself, then hands its save (or a queryset its bulk insert) to
`OutboxBase.write_path`, which the app sets to the write path of `outbox.writes` when
it is ready (until then a row is written at once), so this layer never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from django.db import models

# An outbox row (`outbox.models.OutboxBase`, which imports this module).
_Row = TypeVar("_Row", bound=models.Model)


class WritePath(Protocol):
    """How validated outbox rows reach the database.

    `save` gets the row, its database, its payload as checked JSON text, a callable doing
    Django's own save, and whether the row may be held (a plain insert of a new row).
    `bulk_create` gets the rows, their payload texts and a callable doing Django's own
    bulk insert, and returns the rows. An implementation must write every row exactly
    once, and the row must end up as Django's own save would leave it.
    """

    def save(
        self,
        row: models.Model,
        using: str,
        payload_json: str,
        save_now: Callable[[], None],
        can_hold: bool,
    ) -> None: ...

    def bulk_create(
        self,
        rows: list[_Row],
        using: str,
        payloads_json: list[str],
        create_now: Callable[[], list[_Row]],
        can_hold: bool,
    ) -> list[_Row]: ...
