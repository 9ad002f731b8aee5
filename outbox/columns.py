"""Column values: how one read or returned by hand-written SQL becomes the value a
queryset gives, and how a message id is made (in Python, and as a database default)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Func, Model, UUIDField

Convert = Callable[[Any], Any]


def column_converter(model: type[Model], name: str, connection: BaseDatabaseWrapper) -> Convert:
    """How Django turns column `name` of `model` into a value, as one function: the
    backend's converters, then the field's own (a custom decoder, a time zone)."""
    column = model._meta.get_field(name).get_col(model._meta.db_table)  # type: ignore[union-attr]
    converters = [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
    if not converters:
        return as_is

    def convert(value: Any) -> Any:
        for function in converters:
            value = function(value, column, connection)
        return value

    return convert


def as_is(value: Any) -> Any:
    """The converter of a column Django loads as the driver returns it."""
    return value


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
