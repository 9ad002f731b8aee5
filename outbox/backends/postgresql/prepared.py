"""Prepared statements for the PostgreSQL fast path, where the connection allows them.

Django leaves psycopg's prepared statements off (`prepare_threshold` None), since a
transaction-pooling proxy (PgBouncer before 1.21) may send a statement prepared on one
server session to another. Where the `OPTIONS` of a database set `prepare_threshold`,
the engine runs its statements on a server-side binding cursor of its own (kept per
connection, `outbox.cursors`), so psycopg prepares each one after that many executions
on the connection, whether or not Django binds the project's own queries server-side.

A prepared statement is parsed once, and, once PostgreSQL judges a generic plan no
dearer than planning each call, planned once: planning the claim of a synchronous flush
costs more than running it. The single-shard claim (`claim_key_read`) takes its key as
scalars so that its generic plan costs the same as a planned one and is chosen.

Only statements whose parameters are all scalars are prepared (the backend says which):
a generic plan takes an array parameter for 10 elements, and PostgreSQL's `auto` plan
cache mode, seeing it no dearer than the plans made for small flushes, kept it for a
drain's batch of thousands of shards too, where it settled, claimed and read far slower
than a plan made for the batch (bench/README.md, "Why array statements are not
prepared", has the figures).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from outbox.cursors import kept_cursor

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def prepared_cursor(connection: BaseDatabaseWrapper, scalars: bool) -> Any | None:
    """The engine's server-side binding cursor on this connection, or None where its
    driver connection does not prepare statements (Django's default; psycopg 2), and
    while Django logs queries (DEBUG, `CaptureQueriesContext`): Django's log reads the
    SQL of a client-side binding connection from psycopg's client-side cursor, so the
    statements then run on Django's own cursor, to be logged with their SQL. `scalars`:
    the statement's parameters are all scalars, and it may be prepared; any other runs
    on a cursor of its own that never prepares."""
    connection.ensure_connection()
    if connection.queries_logged:
        return None
    if getattr(connection.connection, "prepare_threshold", None) is None:
        return None
    if scalars:
        return kept_cursor(connection, "engine", _server_side)
    return kept_cursor(connection, "engine-unprepared", _never_prepared)


def _server_side(driver: Any) -> Any:
    import psycopg

    return psycopg.Cursor(driver)


def _never_prepared(driver: Any) -> Any:
    return _never_prepared_cursor_class()(driver)


@cache
def _never_prepared_cursor_class() -> type:
    """A server-side binding cursor whose every execute is unprepared (Django's cursor
    wrapper, around it, passes no `prepare` of its own). Made once, on first use:
    psycopg is imported only where the engine prepares."""
    import psycopg

    class NeverPrepared(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
            return super().execute(query, params, **{**options, "prepare": False})

    return NeverPrepared
