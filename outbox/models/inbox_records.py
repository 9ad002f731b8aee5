"""The inbox: which receiver has applied which message, for `outbox.inbox_receiver`."""

from __future__ import annotations

import datetime
from typing import Any, cast

from django.db import models
from django.db.models.functions import Now


class InboxRecordQuerySet(models.QuerySet[Any]):
    def older_than(self, seconds: float) -> InboxRecordQuerySet:
        """Records made more than `seconds` ago, by the database clock."""
        cutoff = Now() - datetime.timedelta(seconds=seconds)
        return cast(InboxRecordQuerySet, self.filter(date_added__lt=cutoff))

    def prune_slice(self, seconds: float, rows: int) -> int:
        """Delete up to `rows` of the oldest records past `seconds`; how many went."""
        ids = list(self.older_than(seconds).order_by("id").values_list("id", flat=True)[:rows])
        if not ids:
            return 0
        deleted: int = self.filter(id__in=ids).delete()[0]
        return deleted


class InboxRecord(models.Model):
    """One message applied by one inbox receiver, written in the receiver's transaction,
    so it exists exactly when the receiver's writes were committed."""

    id = models.BigAutoField(primary_key=True)
    receiver = models.CharField(max_length=255, help_text="The inbox receiver's name.")
    message_id = models.UUIDField()
    date_added = models.DateTimeField(db_default=Now(), editable=False)

    objects = InboxRecordQuerySet.as_manager()

    class Meta:
        verbose_name = "inbox record"
        constraints = [
            models.UniqueConstraint(fields=["receiver", "message_id"], name="outbox_inbox_once"),
        ]
        indexes = [models.Index(fields=["date_added"], name="outbox_inbox_age")]

    def __str__(self) -> str:
        return f"{self.receiver} applied {self.message_id}"
