"""The PostgreSQL backend: everything the outbox does that only PostgreSQL can.

- `backend`: `PostgresBackend`, each engine step in one statement, and the deferred
  writer's COMMIT sent with its last INSERT;
- `statements`: every statement, named and rendered once per outbox table, with the
  fragments they share (names and joins), finding the shards a claim takes, and the
  settle at the end of a round; `params` makes their parameters;
- `prepared`: the cursors that let psycopg prepare statements, where the database allows;
- `insert`: the cursor the deferred writer's last INSERT runs on;
- `notify`: the NOTIFY trigger on every outbox table and the LISTEN connection that wakes
  an idle drain loop;
- `errors`: which errors are transient lock errors.
"""

from __future__ import annotations

from outbox.backends.postgresql.backend import PostgresBackend

__all__ = ["PostgresBackend"]
