"""The COMMIT in the same round trip as the deferred writer's last INSERT.

psycopg 3 with client-side binding (Django's default) sends a multi-statement query as
one message, so `INSERT ...; COMMIT` costs one round trip; psycopg's own commit
afterwards finds the transaction already ended and does nothing. Other drivers and
server-side binding cannot, and get no wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections


def commit_with_last_insert(using: str) -> Callable[..., Any] | None:
    """An execute wrapper appending COMMIT to the INSERT it runs, where this works."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3 or connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        return None
    return _append_commit


def _append_commit(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
) -> Any:
    if not many and sql.lstrip().upper().startswith("INSERT"):
        sql = f"{sql}; COMMIT"
    return execute(sql, params, many, context)
