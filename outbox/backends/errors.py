"""Recognise transient lock errors by their codes, never by their message text."""

from __future__ import annotations

# PostgreSQL SQLSTATEs: serialization_failure, deadlock_detected, lock_not_available.
_POSTGRES_SQLSTATES = {"40001", "40P01", "55P03"}
# MySQL/MariaDB error numbers: ER_LOCK_DEADLOCK (SQLSTATE 40001), ER_LOCK_WAIT_TIMEOUT.
_MYSQL_ERRNOS = {1213, 1205}
# SQLite primary result codes: SQLITE_BUSY, SQLITE_LOCKED (extended codes share the low byte).
_SQLITE_CODES = {5, 6}


def is_transient_lock_error(exc: BaseException) -> bool:
    """True if `exc`, or the driver error behind it, is a deadlock or lock timeout."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_lock_error(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_lock_error(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if sqlstate in _POSTGRES_SQLSTATES:
        return True
    sqlite_code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int) and sqlite_code & 0xFF in _SQLITE_CODES:
        return True
    module = type(exc).__module__
    return module.startswith("MySQLdb") and bool(exc.args) and exc.args[0] in _MYSQL_ERRNOS
