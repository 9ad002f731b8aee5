"""The one place that picks a backend for a database.

Fast paths are tried in order; the first that supports the connection (its vendor and
features) wins, unless OUTBOX_FAST_PATH is off. Every other database, and every
database with the fast path off, takes the portable ORM path, which is correct on
SQLite, PostgreSQL and MariaDB/MySQL alike. A MariaDB SKIP LOCKED backend would be one
more entry in FAST_PATHS, with nothing to change in the engine.
"""

from __future__ import annotations

from django.db import connections

from outbox.backends.base import ExecuteWrapper, OutboxBackend
from outbox.backends.portable import PortableBackend
from outbox.backends.postgres import PostgresBackend
from outbox.conf import outbox_settings

FAST_PATHS: tuple[type[OutboxBackend], ...] = (PostgresBackend,)


def backend_class(using: str) -> type[OutboxBackend]:
    """The backend class for a database alias."""
    connection = connections[using]
    if outbox_settings.FAST_PATH:
        for backend in FAST_PATHS:
            if backend.supports(connection):
                return backend
    return PortableBackend


def get_backend(using: str) -> OutboxBackend:
    """The engine backend for a database alias (a fresh instance: cheap, not shared)."""
    return backend_class(using)(using)


def commit_with_last_insert(using: str) -> ExecuteWrapper | None:
    """The write path's hook: the execute wrapper that sends the deferred writer's COMMIT
    with its last INSERT, from the first backend that supports the database and offers
    it (PostgreSQL with psycopg 3). It is a write-side capability, so OUTBOX_FAST_PATH,
    which chooses how to drain, does not turn it off."""
    connection = connections[using]
    candidates: tuple[type[OutboxBackend], ...] = (*FAST_PATHS, PortableBackend)
    for backend in candidates:
        if backend.supports(connection):
            return backend.commit_with_last_insert(connection)
    return None
