"""Database backends of the engine: the contract in `base`, the choice in `select`."""

from __future__ import annotations

from outbox.backends.base import OutboxBackend
from outbox.backends.select import get_backend

__all__ = ["OutboxBackend", "get_backend"]
