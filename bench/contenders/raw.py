"""(a) The raw-SQL limit: how fast PostgreSQL itself can claim and delete these rows.

A plain psycopg loop in autocommit: each statement claims the next `batch_rows` due rows
in id order (`FOR UPDATE SKIP LOCKED`), deletes them and returns them; a trivial
function is called per row. No Django, no shards, no leases, no coalescing, no
ordering guarantee beyond id order: an upper bound no outbox can reach, to see how much
of it the engine's bookkeeping costs. With `--receiver kwargs` the function gets the row's
columns by keyword and reads each (`bench.receivers.read_columns`), as the engine's
receivers then read their keyword arguments.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.db import conninfo


def _receive(*row: Any) -> None:
    """The raw loop's receiver: does nothing, like the bench receivers."""


COLUMNS = ("id", "shard_scope", "shard_identifier", "category", "object_identifier", "payload")


def run(budget: float, batch_rows: int) -> dict[str, Any]:
    from bench.receivers import KWARGS, read_columns
    from outbox.models import RegionOutbox

    table = RegionOutbox._meta.db_table
    statement = (
        f'DELETE FROM "{table}" WHERE id IN ('
        f'  SELECT id FROM "{table}" WHERE scheduled_for <= now()'
        "  ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
        ") RETURNING id, shard_scope, shard_identifier, category, object_identifier, payload"
    )
    deadline = time.monotonic() + budget
    rows = statements = 0
    complete = False
    with psycopg.connect(**conninfo(), autocommit=True) as conn:
        while time.monotonic() < deadline:
            batch = conn.execute(statement, [batch_rows]).fetchall()
            statements += 1
            if not batch:
                complete = True
                break
            if KWARGS:
                for row in batch:
                    read_columns(**dict(zip(COLUMNS, row, strict=True)))
            else:
                for row in batch:
                    _receive(*row)
            rows += len(batch)
    return {
        "rows_retired": rows,
        "receiver_calls": rows,
        "statements": statements,
        "complete": complete,
    }
