"""The PostgreSQL backend: everything the outbox does that only PostgreSQL can.

- `backend`: `PostgresBackend`, each engine step in one statement, the cursors that let
  psycopg prepare them where the database allows, and the deferred writer's COMMIT sent
  with its last INSERT;
- `statements`: every statement, named and rendered once per outbox table, with the
  fragments they share (names and joins), finding the shards a claim takes, and the
  settle at the end of a round, and their parameters;
- `notify`: the NOTIFY trigger on every outbox table and the LISTEN connection that wakes
  an idle drain loop.

Its transient lock errors are recognised in `outbox.backends.lock_errors`.
"""

from __future__ import annotations

from outbox.backends.postgresql.backend import PostgresBackend

__all__ = ["PostgresBackend"]
