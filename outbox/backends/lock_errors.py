"""Which database errors are transient lock errors (a deadlock, a lock or serialization
timeout), per vendor, recognised by their error codes, never by their text: the engine
retries what these recognise instead of failing the round."""

from __future__ import annotations

# PostgreSQL's serialization_failure, deadlock_detected, lock_not_available.
POSTGRESQL_LOCK_SQLSTATES = frozenset({"40001", "40P01", "55P03"})

# MariaDB's and MySQL's ER_LOCK_DEADLOCK (SQLSTATE 40001) and ER_LOCK_WAIT_TIMEOUT.
MARIADB_LOCK_ERRNOS = frozenset({1213, 1205})


def postgresql_lock_error(error: BaseException) -> bool:
    """Whether this one error (not its causes) is a PostgreSQL deadlock or lock timeout:
    psycopg 3 names its SQLSTATE `sqlstate`, psycopg 2 `pgcode`."""
    sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return sqlstate in POSTGRESQL_LOCK_SQLSTATES


def mariadb_lock_error(error: BaseException) -> bool:
    """Whether this one error (not its causes) is a MariaDB or MySQL deadlock or lock wait
    timeout, as mysqlclient raises them: the error number is the first argument."""
    module = type(error).__module__
    return (
        module.startswith("MySQLdb") and bool(error.args) and error.args[0] in MARIADB_LOCK_ERRNOS
    )
