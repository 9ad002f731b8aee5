"""MariaDB's raw-SQL loops, for the MariaDB section (`bench/mariadb.py`).

Plain MySQLdb on a connection of its own (the parameters Django would use), the same
batch as the engine, a trivial function called per row with the row's payload decoded
(`json.loads`): MySQLdb returns a JSON column as text, where psycopg hands the raw loops
on PostgreSQL the decoded value, so both limits deliver what a receiver is given. No
Django beyond reading table names, no ordering across batches, no coalescing, no
retries.

- `raw_skip_locked`: per batch, one transaction claims the next due rows in id order
  `FOR UPDATE SKIP LOCKED`, deletes them by id and commits: the semantics of
  `bench/contenders/raw.py` in three round trips, since MariaDB cannot DELETE by a
  subquery with LIMIT.
- `raw_delete_returning`: per batch, one `DELETE ... ORDER BY id LIMIT n RETURNING`
  in autocommit (one round trip; it waits on locked rows instead of skipping them, the
  same for one consumer).
- `raw_leased`: the leased floor, `bench/contenders/raw_leased.py` in MariaDB's SQL: the
  skip-locked loop plus exactly the lease bookkeeping the library's contract needs (one
  `ShardLease` row per shard, committed before any receiver runs, deleted once the shard
  is done) and nothing more. Per batch, one transaction claims the rows as above and
  inserts one lease row per distinct shard among them (`INSERT IGNORE ... SELECT
  DISTINCT ... RETURNING`, one fresh token per batch; MariaDB returns only the rows it
  inserted, so the shards won), then commits; the receiver sees each row of a won
  shard; then one transaction deletes those rows by id and this batch's lease rows and
  commits. Six statements a batch, counting the COMMITs. Meant for one process: a batch
  whose rows all belong to shards leased elsewhere delivers nothing and ends the loop.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

HOLDER = "raw"
LEASE_SECONDS = 60
COLUMNS = "id, shard_scope, shard_identifier, category, object_identifier, payload"


def _receive(*row: Any) -> None:
    """The raw loops' receiver: does nothing, like the bench receivers."""


def _deliver(row: tuple[Any, ...]) -> None:
    """Call the receiver with the row's payload decoded, as psycopg decodes jsonb."""
    _receive(*row[:-1], json.loads(row[-1]))


def _raw_connection() -> Any:
    import MySQLdb
    from django.db import connection

    return MySQLdb.connect(**connection.get_connection_params())


def _claim(table: str) -> str:
    """The next due rows in id order, locked, skipping rows another consumer holds."""
    return (
        f"SELECT {COLUMNS} FROM `{table}` WHERE scheduled_for <= NOW(6)"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
    )


def _result(rows: int, statements: int, complete: bool) -> dict[str, Any]:
    return {
        "rows_retired": rows,
        "receiver_calls": rows,
        "statements": statements,
        "complete": complete,
    }


def raw_skip_locked(budget: float, batch_rows: int) -> dict[str, Any]:
    """Per batch, one transaction: claim the next due rows in id order, skipping locked
    ones, delete them, commit; then call the receiver per row."""
    from outbox.models import RegionOutbox

    table = RegionOutbox._meta.db_table
    claim = _claim(table)
    deadline, rows, statements = time.monotonic() + budget, 0, 0
    complete = False
    conn = _raw_connection()
    conn.autocommit(False)
    cursor = conn.cursor()
    while time.monotonic() < deadline:
        cursor.execute(claim, [batch_rows])
        batch = cursor.fetchall()
        if not batch:
            conn.commit()
            complete = True
            break
        ids = ",".join(str(row[0]) for row in batch)
        cursor.execute(f"DELETE FROM `{table}` WHERE id IN ({ids})")
        conn.commit()
        statements += 3
        for row in batch:
            _deliver(row)
        rows += len(batch)
    conn.close()
    return _result(rows, statements, complete)


def raw_delete_returning(budget: float, batch_rows: int) -> dict[str, Any]:
    """Per batch, one statement in autocommit: delete the next due rows in id order and
    return them; then call the receiver per row."""
    from outbox.models import RegionOutbox

    statement = (
        f"DELETE FROM `{RegionOutbox._meta.db_table}` WHERE scheduled_for <= NOW(6)"
        f" ORDER BY id LIMIT %s RETURNING {COLUMNS}"
    )
    deadline, rows, statements = time.monotonic() + budget, 0, 0
    complete = False
    conn = _raw_connection()
    conn.autocommit(True)
    cursor = conn.cursor()
    while time.monotonic() < deadline:
        cursor.execute(statement, [batch_rows])
        batch = cursor.fetchall()
        statements += 1
        if not batch:
            complete = True
            break
        for row in batch:
            _deliver(row)
        rows += len(batch)
    conn.close()
    return _result(rows, statements, complete)


def _lease_statement(outbox: str, lease: str) -> str:
    """One lease row per distinct shard among the claimed ids (`{ids}` filled in per
    batch); the shards whose row was inserted, i.e. won, come back."""
    return (
        f"INSERT IGNORE INTO `{lease}` (outbox, region_name, shard_scope, shard_identifier,"
        " token, holder, claimed_at, expires_at)"
        " SELECT DISTINCT %s, '', shard_scope, shard_identifier, %s, %s, NOW(6),"
        f" NOW(6) + INTERVAL {LEASE_SECONDS} SECOND FROM `{outbox}` WHERE id IN ({{ids}})"
        " RETURNING shard_scope, shard_identifier"
    )


def raw_leased(budget: float, batch_rows: int) -> dict[str, Any]:
    """Per batch: claim the rows and lease their shards in one transaction, call the
    receiver per row of a won shard, then delete those rows and the batch's lease rows
    in a second transaction."""
    from outbox.models import RegionOutbox, ShardLease

    outbox, lease = RegionOutbox._meta.db_table, ShardLease._meta.db_table
    claim, leasing = _claim(outbox), _lease_statement(outbox, lease)
    label = RegionOutbox._meta.label_lower
    deadline, rows, statements = time.monotonic() + budget, 0, 0
    complete = False
    conn = _raw_connection()
    conn.autocommit(False)
    cursor = conn.cursor()
    while time.monotonic() < deadline:
        token = uuid.uuid4().hex
        cursor.execute(claim, [batch_rows])
        batch = cursor.fetchall()
        if not batch:
            conn.commit()
            statements += 2
            complete = True
            break
        cursor.execute(
            leasing.format(ids=",".join(str(row[0]) for row in batch)), [label, token, HOLDER]
        )
        won = set(cursor.fetchall())
        conn.commit()
        delivered = [row for row in batch if (row[1], row[2]) in won]
        for row in delivered:
            _deliver(row)
        ids = ",".join(str(row[0]) for row in delivered) or "NULL"
        cursor.execute(f"DELETE FROM `{outbox}` WHERE id IN ({ids})")
        cursor.execute(f"DELETE FROM `{lease}` WHERE token = %s", [token])
        conn.commit()
        statements += 6
        rows += len(delivered)
        if not delivered:  # every shard leased elsewhere: not for more than one process
            break
    conn.close()
    return _result(rows, statements, complete)
