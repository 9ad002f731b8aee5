"""The deferred writer's COMMIT sent with its last INSERT, on PostgreSQL.

psycopg 3 with client-side binding (Django's default) sends a multi-statement query as
one message, so `INSERT ...; COMMIT` costs one round trip; psycopg's own commit
afterwards finds the transaction ended and does nothing. Server-side binding and
psycopg 2 cannot, so they are offered nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


class AppendCommit:
    """The execute wrapper that appends the COMMIT to the INSERT it wraps, and the cursor
    that INSERT runs on (`outbox.cursors.CommitWithInsert`)."""

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not many and sql.lstrip().upper().startswith("INSERT"):
            sql = f"{sql}; COMMIT"
        return execute(sql, params, many, context)

    def cursor(self, driver: Any) -> Any:
        """A cursor that loads timestamptz with psycopg's own loader (its C version where
        installed) instead of Django's, a Python subclass that costs a returned row more
        than the rest of its statement's Python; the write path then sets the tzinfo as
        Django's loader does."""
        from psycopg.types.datetime import TimestamptzLoader

        cursor = driver.cursor()
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        return cursor


def commit_with_last_insert(connection: BaseDatabaseWrapper) -> AppendCommit | None:
    """`AppendCommit` where psycopg 3 binds client-side, else None."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    options = connection.settings_dict.get("OPTIONS", {})
    if not is_psycopg3 or options.get("server_side_binding"):
        return None
    return _APPEND_COMMIT


_APPEND_COMMIT = AppendCommit()
