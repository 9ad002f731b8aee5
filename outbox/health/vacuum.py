"""Vacuum health on PostgreSQL, beside the backlog snapshot (`outbox.health.snapshot`):
what holds back vacuum in the database, and the dead tuples of the outbox tables and
the lease table.

An outbox table turns over every row, so its dead tuples grow with the message rate
until a vacuum removes them, and nothing can remove them while an older transaction may
still see them. `read(alias, models)` returns, on PostgreSQL:

- `autovacuum`: whether autovacuum runs on the server at all (the `autovacuum` setting).
- `oldest_xmin`: the holder of the oldest transaction id that vacuum of this database's
  tables must respect (None when nothing holds one): a session's open transaction or
  snapshot (`pg_stat_activity.backend_xid`/`backend_xmin`, in this database or in none,
  as a standby's WAL sender; our own session and autovacuum's workers left out), a
  prepared transaction (`pg_prepared_xacts`, this database) or a
  replication slot (`pg_replication_slots.xmin`, any database). Its `xid_age` is always
  known; `age_seconds` is the transaction's age (a prepared one's since it was prepared)
  and is None for a slot and for another role's session, whose `xact_start` and `state`
  PostgreSQL shows only to that role, superusers and `pg_read_all_stats`. A slot's
  `catalog_xmin` holds back vacuum of the system catalogs only, not of these tables, so
  it is reported on the slot but does not rank it.
- per table (`models`' tables and the lease table): live and dead tuples, the last manual
  and automatic vacuum, the autovacuum count and the table's storage options, from
  `pg_stat_user_tables`, found by the table's real name (`to_regclass`, so a table in
  another schema on the search path, or named with one, is found).

Elsewhere `read` returns None: the figures do not exist there. Every statement only
reads; a role that is not a superuser runs them (see above for what it cannot see).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Model

from outbox.models import ShardLease

# Discards this session's cached statistics snapshot, so figures read inside a
# transaction are as fresh as the server's (stats_fetch_consistency = cache); and
# whether autovacuum runs at all on this server.
FRESH_STATISTICS = "SELECT pg_stat_clear_snapshot(), current_setting('autovacuum') = 'on'"

OLDEST_XMIN = """
WITH holders AS (
    SELECT 'session' AS kind,
           greatest(age(backend_xid), age(backend_xmin)) AS xid_age,
           extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_seconds,
           pid, usename::text AS role, application_name AS application, state,
           NULL::text AS name, NULL::bigint AS catalog_xid_age
    FROM pg_stat_activity
    -- Sessions with a user: clients, WAL senders (a standby's feedback), background
    -- workers. Autovacuum workers have none, and a VACUUM does not hold the horizon.
    WHERE pid <> pg_backend_pid()
      AND usesysid IS NOT NULL
      AND (datname = current_database() OR datid IS NULL)
      AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
    UNION ALL
    SELECT 'prepared transaction', age(transaction),
           extract(epoch FROM clock_timestamp() - prepared)::float8,
           NULL, owner::text, NULL, NULL, gid, NULL
    FROM pg_prepared_xacts
    WHERE database = current_database()
    UNION ALL
    SELECT 'replication slot', age(xmin), NULL, active_pid, NULL, NULL,
           CASE WHEN active THEN 'active' ELSE 'inactive' END, slot_name::text,
           age(catalog_xmin)
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL
)
SELECT kind, xid_age, age_seconds, pid, role, application, state, name, catalog_xid_age
FROM holders
ORDER BY xid_age DESC, age_seconds DESC NULLS LAST
LIMIT 1
"""

TABLE_STATISTICS = """
SELECT stats.n_live_tup, stats.n_dead_tup, stats.last_vacuum, stats.last_autovacuum,
       stats.autovacuum_count, class.reloptions
FROM unnest(%s::text[]) WITH ORDINALITY AS wanted(quoted_name, position)
LEFT JOIN pg_stat_user_tables AS stats ON stats.relid = to_regclass(wanted.quoted_name)
LEFT JOIN pg_class AS class ON class.oid = stats.relid
ORDER BY wanted.position
"""

HOLDER_FIELDS = (
    "kind",
    "xid_age",
    "age_seconds",
    "pid",
    "role",
    "application",
    "state",
    "name",
    "catalog_xid_age",
)


def read(alias: str, models: Sequence[type[Model]]) -> dict[str, Any] | None:
    """The vacuum reading of `alias` for `models`' tables and the lease table, as
    JSON-friendly values (see the module doc); None where the database is not PostgreSQL.

    `{"autovacuum": bool, "oldest_xmin": holder or None, "tables": {label: table}}`;
    the lease table is there under its label, `outbox.ShardLease`."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    tables: list[type[Model]] = [*models, ShardLease]
    chosen = {model._meta.label: model._meta.db_table for model in tables}
    quoted = [connection.ops.quote_name(name) for name in chosen.values()]
    with connection.cursor() as cursor:
        cursor.execute(FRESH_STATISTICS)
        autovacuum = cursor.fetchone()[1]
        cursor.execute(OLDEST_XMIN)
        holder = cursor.fetchone()
        cursor.execute(TABLE_STATISTICS, [quoted])
        statistics = cursor.fetchall()
    return {
        "autovacuum": autovacuum,
        "oldest_xmin": dict(zip(HOLDER_FIELDS, holder, strict=True)) if holder else None,
        "tables": {
            label: _table(name, row)
            for (label, name), row in zip(chosen.items(), statistics, strict=True)
        },
    }


def _table(name: str, row: Sequence[Any]) -> dict[str, Any]:
    """One table's figures; all None but the name when PostgreSQL has no statistics for
    it (not found on this database)."""
    live, dead, vacuumed, autovacuumed, autovacuums, options = row
    return {
        "table": name,
        "live_tuples": live,
        "dead_tuples": dead,
        "last_vacuum": _when(vacuumed),
        "last_autovacuum": _when(autovacuumed),
        "autovacuum_count": autovacuums,
        "options": list(options or []) if live is not None else None,
    }


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def attach(tables: Sequence[dict[str, Any]], models: Sequence[type[Model]]) -> None:
    """Give each `outbox.health.snapshot.table_status` entry of `models` its "vacuum": its own
    table's figures, the lease table's and the oldest xmin of its database, or None
    where that database is not PostgreSQL. One reading per database."""
    by_label = {model._meta.label: model for model in models}
    on_database: dict[str, list[type[Model]]] = {}
    for table in tables:
        on_database.setdefault(table["database"], []).append(by_label[table["table"]])
    readings = {alias: read(alias, chosen) for alias, chosen in on_database.items()}
    for table in tables:
        reading = readings[table["database"]]
        table["vacuum"] = (
            None
            if reading is None
            else {
                "table": reading["tables"][table["table"]],
                "lease_table": reading["tables"][ShardLease._meta.label],
                "oldest_xmin": reading["oldest_xmin"],
                "autovacuum": reading["autovacuum"],
            }
        )


def describe_holder(holder: dict[str, Any]) -> str:
    """E.g. "session pid 4242 (role app, application 'report', idle in transaction),
    125s and 3021 xids old"."""
    age = f"{holder['age_seconds']:.0f}s" if holder["age_seconds"] is not None else "age unknown"
    if holder["kind"] == "session":
        state = holder["state"] or "state hidden: another role's session"
        who = (
            f"session pid {holder['pid']} (role {holder['role']}, "
            f"application {holder['application']!r}, {state})"
        )
    elif holder["kind"] == "prepared transaction":
        who = f"prepared transaction {holder['name']!r} (owner {holder['role']})"
    else:
        who = f"replication slot {holder['name']!r} ({holder['state']})"
    return f"{who}, {age} and {holder['xid_age']} xids old"


def describe_table(figures: dict[str, Any]) -> str:
    """E.g. "outbox_regionoutbox: 120 dead / 4 live tuples, last autovacuum
    2026-01-02T03:04:05+00:00, last vacuum never, options fillfactor=90"."""
    if figures["live_tuples"] is None:
        return f"{figures['table']}: no statistics (not found on this database)"
    options = f", options {' '.join(figures['options'])}" if figures["options"] else ""
    return (
        f"{figures['table']}: {figures['dead_tuples']} dead / {figures['live_tuples']} live "
        f"tuples, last autovacuum {figures['last_autovacuum'] or 'never'}, "
        f"last vacuum {figures['last_vacuum'] or 'never'}{options}"
    )
