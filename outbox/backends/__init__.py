"""Database backends of the engine. `get_backend` is the one place that picks a path."""

from __future__ import annotations

from outbox.backends.base import OutboxBackend


def get_backend(using: str) -> OutboxBackend:
    """Return the engine backend for a database alias.

    Every vendor takes the portable path for now: it is correct on SQLite, PostgreSQL
    and MariaDB/MySQL. A vendor fast path plugs in here and nowhere else.
    """
    from outbox.backends.portable import PortableBackend

    return PortableBackend(using)


__all__ = ["OutboxBackend", "get_backend"]
