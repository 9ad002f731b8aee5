"""MariaDB's and MySQL's transient lock errors, recognised by their error number, never
by their text."""

from __future__ import annotations

# ER_LOCK_DEADLOCK (SQLSTATE 40001), ER_LOCK_WAIT_TIMEOUT.
LOCK_ERRNOS = frozenset({1213, 1205})


def is_lock_error(error: BaseException) -> bool:
    """Whether this one error (not its causes) is a deadlock or a lock wait timeout, as
    mysqlclient raises them: the error number is the first argument."""
    module = type(error).__module__
    return module.startswith("MySQLdb") and bool(error.args) and error.args[0] in LOCK_ERRNOS
