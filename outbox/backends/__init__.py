"""Database backends of the engine. `get_backend` is the one place that picks a path."""

from __future__ import annotations

from outbox.backends.base import OutboxBackend


def get_backend(using: str) -> OutboxBackend:
    """Return the engine backend for a database alias.

    PostgreSQL takes the fast path (one statement per engine step) unless
    OUTBOX_FAST_PATH is off; every other database takes the portable ORM path, which is
    correct on SQLite, PostgreSQL and MariaDB/MySQL alike.
    """
    from django.db import connections

    from outbox.conf import outbox_settings

    if connections[using].vendor == "postgresql" and outbox_settings.FAST_PATH:
        from outbox.backends.postgres import PostgresBackend

        return PostgresBackend(using)
    from outbox.backends.portable import PortableBackend

    return PortableBackend(using)


__all__ = ["OutboxBackend", "get_backend"]
