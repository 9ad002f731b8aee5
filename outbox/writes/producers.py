"""Models that emit their outboxes on save, delete, bulk_create, bulk_update and update.

Subclass `OutboxProducer` and implement `outboxes_for_update()` (and, if deletes need a
different message, `outboxes_for_delete()`). The model change and its outbox rows are
written in one transaction on the model's database; the shards are flushed after commit
unless an enclosing `outbox_context(flush=False)` (or `OUTBOX_FLUSH = False`) says
otherwise.

A delete is announced by default with the update messages carrying ``payload=None``, so
a receiver tells a delete from an update by its payload::

    @receiver(process_region_outbox, sender=Category.ORGANIZATION_UPDATE)
    def sync_org(object_identifier, payload, **kwargs):
        if payload is None:  # the organization was deleted
            Replica.objects.filter(id=object_identifier).delete()
        else:
            Replica.objects.update_or_create(id=object_identifier, defaults=payload)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connections, models, router, transaction

from outbox.exceptions import InvalidOutboxMessage
from outbox.models import OutboxBase
from outbox.writes.context import outbox_context

_Model = TypeVar("_Model", bound="OutboxProducer")

# Objects whose messages `update()` builds and writes at a time.
UPDATE_BATCH = 500


def write_outboxes(outboxes: Iterable[OutboxBase]) -> None:
    """Insert outbox rows with one validated bulk insert per outbox table."""
    by_table: dict[type[OutboxBase], list[OutboxBase]] = defaultdict(list)
    for outbox in outboxes:
        by_table[type(outbox)].append(outbox)
    for table, rows in by_table.items():
        table._default_manager.bulk_create(rows)


@contextmanager
def _producing(using: str) -> Iterator[None]:
    with outbox_context(transaction.atomic(using=using)):
        yield


class OutboxProducerQuerySet(models.QuerySet[_Model]):
    def bulk_create(self, objs: Iterable[_Model], *args: Any, **kwargs: Any) -> list[_Model]:
        """Insert in bulk, then emit each object's messages (they need its primary key),
        all in one transaction: one INSERT for the objects, one per outbox table::

            Organization.objects.bulk_create([Organization(name=n) for n in names])

        Where the database cannot return keys from a bulk insert (MySQL), the objects are
        inserted one by one instead. Conflict handling is refused: the messages would
        describe rows that were not written.
        """
        if kwargs.get("ignore_conflicts") or kwargs.get("update_conflicts"):
            raise InvalidOutboxMessage(
                f"{self.model.__name__}.objects.bulk_create() cannot announce rows when "
                "conflicts are ignored or updated; save those objects one by one."
            )
        objs = list(objs)
        with _producing(self.db):
            if not connections[self.db].features.can_return_rows_from_bulk_insert:
                for obj in objs:
                    obj.save(force_insert=True, using=self.db)  # emits its own messages
                return objs
            created = super().bulk_create(objs, *args, **kwargs)
            if any(obj.pk is None for obj in created):
                raise InvalidOutboxMessage(
                    f"{self.model.__name__}.objects.bulk_create() left objects without a "
                    "primary key, so their messages cannot be written."
                )
            write_outboxes(outbox for obj in created for outbox in obj.outboxes_for_update())
        return created

    def bulk_update(self, objs: Iterable[_Model], *args: Any, **kwargs: Any) -> int:
        """Update in bulk, then emit each object's update messages from the objects as
        given (not re-read), in one transaction::

            for org in orgs:
                org.name = org.name.strip()
            Organization.objects.bulk_update(orgs, ["name"])
        """
        objs = list(objs)
        with _producing(self.db):
            # Django's bulk_update calls update(); a plain queryset keeps that from
            # emitting a second time.
            plain: models.QuerySet[_Model] = models.QuerySet(self.model, using=self.db)
            count = plain.bulk_update(objs, *args, **kwargs)
            write_outboxes(outbox for obj in objs for outbox in obj.outboxes_for_update())
        return count

    def update(self, **kwargs: Any) -> int:
        """Update, then emit each changed object's messages, `UPDATE_BATCH` objects at a
        time: memory stays bounded by the batch (and the list of primary keys), not by
        the number of rows updated. The rows are locked (`select_for_update`) first and
        re-read after the UPDATE, so the messages describe the state it produced::

            Organization.objects.filter(plan="trial").update(plan="free")
        """
        with _producing(self.db):
            # Lock the rows so the messages describe the state this update produced.
            pks = list(self.select_for_update().values_list("pk", flat=True))
            count = super().update(**kwargs)
            changed = self.model._base_manager.using(self.db).order_by("pk")
            for start in range(0, len(pks), UPDATE_BATCH):
                batch = changed.filter(pk__in=pks[start : start + UPDATE_BATCH])
                write_outboxes(outbox for obj in batch for outbox in obj.outboxes_for_update())
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete, emitting each object's `outboxes_for_delete()` (built before the rows
        go, so they still have their primary key), in one transaction::

            Organization.objects.filter(name__startswith="test-").delete()

        Objects that Django's cascade deletes send nothing of their own.
        """
        with _producing(self.db):
            outboxes = [
                outbox for obj in self.select_for_update() for outbox in obj.outboxes_for_delete()
            ]
            result = super().delete()
            write_outboxes(outboxes)
        return result


class OutboxProducer(models.Model):
    """Abstract base of models whose changes produce outbox messages."""

    objects = OutboxProducerQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with _producing(using):
            super().save(*args, **kwargs)
            write_outboxes(self.outboxes_for_update())

    def delete(self, using: Any = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        using = using or router.db_for_write(type(self), instance=self)
        with _producing(using):
            outboxes = self.outboxes_for_delete()
            result = super().delete(using=using, keep_parents=keep_parents)
            write_outboxes(outboxes)
        return result

    def outboxes_for_update(self) -> list[OutboxBase]:
        """The messages announcing this object's current state."""
        raise NotImplementedError(f"{type(self).__name__} must implement outboxes_for_update()")

    def outboxes_for_delete(self) -> list[OutboxBase]:
        """The messages announcing this object's deletion.

        By default, the messages of `outboxes_for_update()` with ``payload=None``: same
        shard, category and object, so a delete coalesces with the updates still pending
        for the object and wins over them, and receivers tell it apart by
        ``payload is None``. (If your update messages carry no payload either, receivers
        re-read the object: it is gone.) Override it to send something else, e.g. the
        last state (``return self.outboxes_for_update()``) or a category of its own.
        """
        outboxes = self.outboxes_for_update()
        for outbox in outboxes:
            outbox.payload = None
        return outboxes
