"""The one place that picks a backend for a database.

Fast paths are tried in order; the first that supports the connection (its vendor and
version) wins, unless OUTBOX_FAST_PATH is off: PostgreSQL, and MariaDB 10.6 or later.
Every other database (SQLite, MySQL, MariaDB before 10.6), and every database with the
fast path off, takes the portable ORM path, which is correct on SQLite, PostgreSQL and
MariaDB/MySQL alike.
"""

from __future__ import annotations

from django.db import connections

from outbox.backends.base import ExecuteWrapper, OutboxBackend
from outbox.backends.mariadb import MariaDBBackend
from outbox.backends.portable import PortableBackend
from outbox.backends.postgres import PostgresBackend
from outbox.conf import outbox_settings

FAST_PATHS: tuple[type[OutboxBackend], ...] = (PostgresBackend, MariaDBBackend)


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
    which chooses how to drain, does not turn it off. Asked once per database: it
    depends only on the database's settings and driver."""
    try:
        return _commit_wrappers[using]
    except KeyError:
        pass
    connection = connections[using]
    wrapper = None
    candidates: tuple[type[OutboxBackend], ...] = (*FAST_PATHS, PortableBackend)
    for backend in candidates:
        if backend.supports(connection):
            wrapper = backend.commit_with_last_insert(connection)
            break
    _commit_wrappers[using] = wrapper
    return wrapper


_commit_wrappers: dict[str, ExecuteWrapper | None] = {}
