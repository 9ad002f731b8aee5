"""Server plumbing: create the stress database, empty its tables, kill connections."""

from __future__ import annotations

import os
from typing import Any


def _raw(dbname: str | None) -> Any:
    """A DB-API connection (autocommit) to the server, outside Django."""
    if os.environ.get("STRESS_DB", "postgres") == "postgres":
        import psycopg

        return psycopg.connect(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=int(os.environ.get("PGPORT", "5432")),
            user=os.environ.get("PGUSER", "postgres"),
            password=os.environ.get("PGPASSWORD", ""),
            dbname=dbname or "postgres",
            autocommit=True,
            connect_timeout=10,
        )
    import MySQLdb

    conn = MySQLdb.connect(
        host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("MYSQL_PORT", "3306")),
        user=os.environ.get("MYSQL_USER", "root"),
        password=os.environ.get("MYSQL_PASSWORD", ""),
        connect_timeout=10,
    )
    conn.autocommit(True)
    return conn


def create_database(name: str) -> None:
    """Create the stress database afresh: it is scratch, and a schema left by an older
    version of the app (whose migrations may have been rewritten) must not survive."""
    conn = _raw(None)
    try:
        cur = conn.cursor()
        if os.environ.get("STRESS_DB", "postgres") == "postgres":
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
        else:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def kill_server_connections(server_ids: list[int], process: str) -> int:
    """Terminate these connections of a stress process from the server side; how many
    were alive. Only live connections to the stress database are touched (PostgreSQL
    reuses backend pids, and the server is shared)."""
    conn = _raw(None)
    name = os.environ.get("STRESS_DB_NAME", "outbox_stress")
    killed = 0
    try:
        cur = conn.cursor()
        if os.environ.get("STRESS_DB", "postgres") == "postgres":
            cur.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid = ANY(%s) AND datname = %s AND application_name = %s",
                [list(server_ids), name, process[:60]],
            )
            return int(cur.fetchone()[0])
        if not server_ids:
            return 0
        marks = ", ".join(["%s"] * len(server_ids))
        cur.execute(
            f"SELECT ID FROM information_schema.PROCESSLIST WHERE ID IN ({marks}) AND DB = %s",
            [*server_ids, name],
        )
        for (server_id,) in cur.fetchall():
            try:
                cur.execute(f"KILL CONNECTION {int(server_id)}")
                killed += 1
            except Exception:  # gone meanwhile
                pass
    finally:
        conn.close()
    return killed


def reset() -> None:
    """Empty every table the run touches (Django must be set up)."""
    from django.db import connection

    from outbox.engine import outbox_models
    from outbox.models import InboxRecord, ShardLease
    from stress.models import Conn, Control, Effect, Journal, Skip, Written

    models = [*outbox_models(), ShardLease, InboxRecord, Written, Journal, Effect, Skip]
    models += [Control, Conn]
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(model._meta.db_table)}")
