"""Fail fast, with a clear message, when a database the tests need is unreachable."""

import os
import sys


def check_postgres() -> None:
    import psycopg

    psycopg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=os.environ.get("PGPORT", "5432"),
        user=os.environ.get("PGUSER", "postgres"),
        password=os.environ.get("PGPASSWORD", ""),
        dbname="postgres",
        connect_timeout=5,
    ).close()


def check_mariadb() -> None:
    import MySQLdb

    MySQLdb.connect(
        host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("MYSQL_PORT", "3306")),
        user=os.environ.get("MYSQL_USER", "root"),
        password=os.environ.get("MYSQL_PASSWORD", ""),
        connect_timeout=5,
    ).close()


CHECKS = {
    "postgres": check_postgres,
    "postgres-portable": check_postgres,
    "mariadb": check_mariadb,
    "mariadb-portable": check_mariadb,
}

failed = False
for name in sys.argv[1:]:
    check = CHECKS.get(name)
    if check is None:
        continue
    try:
        check()
    except Exception as exc:
        print(f"{name} is required by the tests but unreachable: {exc}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
