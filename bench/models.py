"""The one model of the bench app: what the write-overhead test saves."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A small row, updated by the write-overhead test with and without an outbox row."""

    name = models.CharField(max_length=100)
    version = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.name
