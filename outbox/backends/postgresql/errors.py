"""PostgreSQL's transient lock errors, recognised by their SQLSTATE, never by their text."""

from __future__ import annotations

# serialization_failure, deadlock_detected, lock_not_available.
LOCK_SQLSTATES = frozenset({"40001", "40P01", "55P03"})


def is_lock_error(error: BaseException) -> bool:
    """Whether this one error (not its causes) is a deadlock or a lock timeout: psycopg 3
    names its SQLSTATE `sqlstate`, psycopg 2 `pgcode`."""
    sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return sqlstate in LOCK_SQLSTATES
