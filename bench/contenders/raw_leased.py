"""(a') The leased raw floor: the raw-SQL limit plus the least a durable shard lease costs.

The library's contract keeps one lease row per shard being drained (`ShardLease`),
committed before any receiver runs and deleted once the shard is done. This is the raw
loop of `bench/contenders/raw.py` with exactly that bookkeeping and nothing more, in
autocommit, two statements per batch:

1. claim + read: the next `batch_rows` due rows in id order (`FOR UPDATE SKIP LOCKED`),
   one lease row per distinct shard among them (`ON CONFLICT DO NOTHING`, one fresh
   token per batch), and the rows of the shards whose lease was won;
2. once the no-op receiver has seen each row: delete those rows by id and this batch's
   lease rows, one data-modifying CTE plus the main DELETE.

The ids travel as one array literal (`"{1,2,3}"` cast with `::bigint[]`), cheaper to
build and send than a list adapted by psycopg. No Django beyond reading table names, no
ordering across batches, no coalescing, no retries: the floor under any drain that keeps
a lease row per shard. Meant for one process: a batch whose rows all belong to shards
leased elsewhere would come back empty and read as the end of the backlog.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

from bench.db import conninfo

HOLDER = "raw"
LEASE_SECONDS = 60


def _receive(*row: Any) -> None:
    """The leased loop's receiver: does nothing, like the bench receivers."""


def statements(identity: bool = False) -> tuple[str, str]:
    """The claim + read statement and the finish statement, for these tables; with
    `identity`, each row read also carries its message id, headers and attempts (what
    a drain must read to give receivers the message's identity)."""
    from outbox.models import RegionOutbox, ShardLease

    outbox, lease = RegionOutbox._meta.db_table, ShardLease._meta.db_table
    more = ", message_id, headers, attempts" if identity else ""
    claim = (
        "WITH due AS ("
        f"  SELECT id, shard_scope, shard_identifier, category, object_identifier, payload{more}"
        f'  FROM "{outbox}" WHERE scheduled_for <= now()'
        "  ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
        "), won AS ("
        f'  INSERT INTO "{lease}" (outbox, region_name, shard_scope, shard_identifier,'
        "    token, holder, claimed_at, expires_at)"
        "  SELECT DISTINCT %(label)s, '', shard_scope, shard_identifier, %(token)s,"
        f"    %(holder)s, now(), now() + interval '{LEASE_SECONDS} seconds' FROM due"
        "  ON CONFLICT DO NOTHING"
        "  RETURNING shard_scope, shard_identifier"
        ") SELECT due.id, due.shard_scope, due.shard_identifier, due.category,"
        "  due.object_identifier, due.payload"
        + more.replace(", ", ", due.")
        + " FROM due JOIN won USING (shard_scope, shard_identifier) ORDER BY due.id"
    )
    finish = (
        f'WITH released AS (DELETE FROM "{lease}" WHERE token = %(token)s)'
        f' DELETE FROM "{outbox}" WHERE id = ANY(%(ids)s::bigint[])'
    )
    return claim, finish


def run(budget: float, batch_rows: int) -> dict[str, Any]:
    from outbox.models import RegionOutbox

    claim, finish = statements()
    label = RegionOutbox._meta.label_lower
    deadline = time.monotonic() + budget
    rows = executed = 0
    complete = False
    with psycopg.connect(**conninfo(), autocommit=True) as conn:
        while time.monotonic() < deadline:
            token = uuid.uuid4().hex
            params = {"limit": batch_rows, "label": label, "token": token, "holder": HOLDER}
            batch = conn.execute(claim, params).fetchall()
            executed += 1
            if not batch:
                complete = True
                break
            for row in batch:
                _receive(*row)
            ids = "{" + ",".join(str(row[0]) for row in batch) + "}"
            conn.execute(finish, {"token": token, "ids": ids})
            executed += 1
            rows += len(batch)
    return {
        "rows_retired": rows,
        "receiver_calls": rows,
        "statements": executed,
        "complete": complete,
    }
