"""The defaults of the `message_id` column: how a message id is made in Python, and by the
database for rows written without one. Migrations (the app's and those of a project's own
outbox tables) name these two by their path here."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Func, UUIDField


def new_message_id() -> uuid.UUID:
    """A new message id: a version 7 UUID (RFC 9562), the Unix time in milliseconds
    followed by 74 random bits. Ids made later sort later, so logs and brokers that
    order by id see roughly the order of writing; uniqueness comes from the random bits
    (a collision needs two ids in the same millisecond with equal 74 random bits)."""
    random_bits = int.from_bytes(os.urandom(10), "big")
    value = (time.time_ns() // 1_000_000) << 80
    value |= 0x7 << 76 | (random_bits >> 68) << 64  # version 7, 12 random bits
    value |= 0b10 << 62 | (random_bits & _LOW_62)  # RFC 9562 variant, 62 random bits
    return uuid.UUID(int=value)


_LOW_62 = (1 << 62) - 1


class RandomUUID(Func):
    """A random UUID made by the database: the column default of `message_id`, so rows
    that exist when the column is added, and rows inserted by code that does not set
    it (an older release during a rolling deploy), each get an id of their own."""

    template = "gen_random_uuid()"  # PostgreSQL
    output_field = UUIDField()

    def as_mysql(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        # MariaDB's UUID(), in the 32 hex digits that fit a char(32) column as well
        return self.as_sql(compiler, connection, template="REPLACE(UUID(), '-', '')", **extra)

    def as_sqlite(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        # the 32 hex digits Django stores for a UUIDField
        return self.as_sql(compiler, connection, template="lower(hex(randomblob(16)))", **extra)
