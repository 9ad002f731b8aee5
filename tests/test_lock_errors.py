"""Transient lock errors are recognised by their codes (#45: one module for every
vendor's): the engine retries these at once instead of failing the round."""

import pytest

from outbox.backends.lock_errors import mariadb_lock_error, postgresql_lock_error


def test_postgresql_lock_errors_are_known_by_their_sqlstate_in_psycopg_3_and_2():
    errors = pytest.importorskip("psycopg.errors")
    assert postgresql_lock_error(errors.DeadlockDetected("deadlock detected"))
    assert postgresql_lock_error(errors.SerializationFailure("could not serialize"))
    assert postgresql_lock_error(errors.LockNotAvailable("could not obtain lock"))
    assert not postgresql_lock_error(errors.UniqueViolation("duplicate key"))

    class Psycopg2Error(Exception):
        pgcode = "40P01"

    assert postgresql_lock_error(Psycopg2Error())
    assert not postgresql_lock_error(RuntimeError("deadlock detected"))  # never by text


def test_mariadb_lock_errors_are_known_by_mysqlclients_error_number():
    mysqldb = pytest.importorskip("MySQLdb")
    assert mariadb_lock_error(mysqldb.OperationalError(1213, "Deadlock found"))
    assert mariadb_lock_error(mysqldb.OperationalError(1205, "Lock wait timeout exceeded"))
    assert not mariadb_lock_error(mysqldb.OperationalError(1062, "Duplicate entry"))
    assert not mariadb_lock_error(mysqldb.OperationalError())
    assert not mariadb_lock_error(RuntimeError(1213, "Deadlock found"))  # not mysqlclient's
