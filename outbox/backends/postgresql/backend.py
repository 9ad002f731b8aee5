"""The PostgreSQL fast path: each engine step is one statement, whatever the batch size.

- Claiming walks the shard index with a recursive skip scan (one index probe per shard
  visited, stopping after enough due shards, so its cost follows the due shards and
  not the backlog), retakes expired leases with `FOR UPDATE SKIP LOCKED` and inserts
  missing ones with `ON CONFLICT DO NOTHING`, all in one statement. Walks resume after
  the last claimed shard and wrap around, so no part of the key space waits behind
  another.
- Reading sends the payload of the newest row of each group only.
- A round ends with one statement that deletes the delivered rows of shards still held,
  reschedules failed rows with per-row values, backs their shards off and releases the
  finished ones, and reports which shards are still held.
The statements themselves live in `statements`; what they bind (keys, ids and failures
made into parameters) and the cursor they run on (prepared where the connection allows)
are at the end of this module.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from outbox.backends.base import (
    Lease,
    MessageReader,
    OutboxBackend,
    Settlement,
    SettleResult,
    ShardFilter,
    Window,
    coalesce,
)
from outbox.backends.listener import WakeListener
from outbox.backends.lock_errors import postgresql_lock_error as is_lock_error
from outbox.backends.postgresql.notify import Listener, channel, notifies, sync_triggers
from outbox.backends.postgresql.statements import Statements, statements
from outbox.cursors import CommitWithInsert
from outbox.internals import kept_cursor
from outbox.models import OutboxBase
from outbox.shards import ShardKey


class PostgresBackend(OutboxBackend):
    wide_batches = True
    settles_behind = True

    @classmethod
    def supports(cls, connection: BaseDatabaseWrapper) -> bool:
        return connection.vendor == "postgresql" and bool(
            connection.features.has_select_for_update_skip_locked
        )

    @classmethod
    def commit_with_last_insert(cls, connection: BaseDatabaseWrapper) -> CommitWithInsert | None:
        return commit_with_last_insert(connection)

    @classmethod
    def lock_error(cls, error: BaseException) -> bool:
        return is_lock_error(error)

    def listener(self, models: Sequence[type[OutboxBase]]) -> WakeListener | None:
        """A LISTEN connection on the tables' channels (`notify`), unless OUTBOX_NOTIFY
        is off."""
        if not notifies():
            return None
        return Listener(self.using, [channel(model) for model in models])

    def after_migrate(self) -> None:
        """Give every outbox table its NOTIFY trigger, or take it away (`notify`)."""
        sync_triggers(self.using)

    def notify_listeners(self, model: type[OutboxBase]) -> None:
        """NOTIFY the table's channel, as its trigger does (sent at commit)."""
        if notifies():
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, '')", [channel(model)])

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._readers: dict[type[OutboxBase], MessageReader] = {}

    def _fetch(
        self, sql: str, params: Any, *, scalars: bool = False, reads: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run one statement; only one with `scalars` alone may be prepared (see
        `prepared`). `reads`: it reads a window's rows, and runs without JIT where it
        can (see `_NO_JIT`)."""
        connection = connections[self.using]
        cursor = prepared_cursor(connection, scalars)
        if cursor is None:
            # Django's own kind of cursor, made once per connection (`kept_cursor`): a
            # round's two statements then make no cursor of their own.
            cursor = kept_cursor(connection, "engine-client", lambda _: connection.create_cursor())
            if reads and connection.get_autocommit() and not connection.in_atomic_block:
                cursor.execute(_NO_JIT + sql, params)
                if _psycopg_3():  # psycopg 2 keeps the last statement's result only
                    cursor.nextset()  # past the SET's own result, to the rows
            else:
                cursor.execute(sql, params)
            return list(cursor.fetchall())
        cursor.execute(sql, params)
        return list(cursor.fetchall())

    def claim(
        self, model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
    ) -> list[ShardKey]:
        if limit <= 0 or where.shards == ():
            lease.shards = []
            return lease.shards
        sql = statements(model)
        params = claim_params(model, lease, where, limit)
        if where.shards is not None:
            won = self._fetch(sql.claim_keys, params)
        else:
            won = self._scan(sql, params, where.after) if where.small else []
            if len(won) < limit:
                params["limit"] = limit - len(won)
                won += self._walk(sql, params, where.after)
        lease.shards = sorted(ShardKey(*row) for row in won)
        return lease.shards

    def _scan(self, sql: Statements, params: dict[str, Any], after: ShardKey | None) -> list[Any]:
        """Claim by a plain scan of twice as many rows as shards wanted: where shards hold
        about one row each, cheaper than the skip scan (see `statements`)."""
        params = {**params, "scan": 2 * params["limit"]}
        if after is None:
            return self._fetch(sql.claim_scan, params)
        return self._fetch(sql.claim_scan_after, {**params, **bound_params("after", after)})

    def _walk(self, sql: Statements, params: dict[str, Any], after: ShardKey | None) -> list[Any]:
        """Claim by walking the shards in key order from `after`, wrapping around."""
        if after is None:
            return self._fetch(sql.claim_walk, params)
        bounds = {**bound_params("after", after), **bound_params("until", after)}
        return self._fetch(sql.claim_walk_around, {**params, **bounds})

    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window:
        per_shard = _share(len(shards), limit)
        # The newest rows' date_added only when the engine measures the lag: parsing a
        # timestamp per message costs the drain about a tenth of its time.
        sql = statements(model)
        statement = sql.read_window_timed if timed else sql.read_window
        rows = self._fetch(statement, [*key_arrays(shards), per_shard], reads=True)
        return self._window(model, rows, shards, per_shard)

    def claim_and_read(
        self,
        model: type[OutboxBase],
        lease: Lease,
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window | None:
        """Claim the given shards and read the won ones in one statement (a synchronous
        flush's first round trip). Its read locks the rows it returns so it sees the
        latest committed state of each (see `statements`), which holds only under READ
        COMMITTED: under any other isolation level this returns None."""
        connection = connections[self.using]
        connection.ensure_connection()
        if not _read_committed(connection):
            return None
        if not shards:
            lease.shards = []
            return Window({}, set())
        per_shard = _share(len(shards), limit)
        sql = statements(model)
        one_key = len(shards) == 1  # the usual flush: its own statement (`prepared`)
        if one_key:
            params = claim_params(model, lease, ShardFilter(), 1)
            params.update(bound_params("key", shards[0]))
            statement = sql.claim_key_read_timed if timed else sql.claim_key_read
        else:
            params = claim_params(model, lease, ShardFilter(shards=tuple(shards)), len(shards))
            statement = sql.claim_keys_read_timed if timed else sql.claim_keys_read
        params["per_shard"] = per_shard
        rows = self._fetch(statement, params, scalars=one_key, reads=True)
        return self._won_window(model, lease, rows, per_shard)

    def claim_due_and_read(
        self,
        model: type[OutboxBase],
        lease: Lease,
        where: ShardFilter,
        limit: int,
        rows: int,
        *,
        timed: bool = False,
    ) -> Window | None:
        """`claim` of up to `limit` due shards by the walk, and the won ones read in the
        same statement (as `claim_and_read` reads them, so only under READ COMMITTED).
        None where the claim would not walk: given shards, or shards of a row or two
        each (`where.small`, claimed by a scan)."""
        if limit <= 0 or where.shards is not None or where.small:
            return None
        connection = connections[self.using]
        connection.ensure_connection()
        if not _read_committed(connection):
            return None
        sql = statements(model)
        per_shard = _share(limit, rows)
        params = claim_params(model, lease, where, limit)
        params["per_shard"] = per_shard
        if where.after is None:
            statement = sql.claim_walk_read_timed if timed else sql.claim_walk_read
        else:
            params.update(bound_params("after", where.after))
            params.update(bound_params("until", where.after))
            statement = sql.claim_walk_around_read_timed if timed else sql.claim_walk_around_read
        return self._won_window(model, lease, self._fetch(statement, params, reads=True), per_shard)

    def _won_window(
        self, model: type[OutboxBase], lease: Lease, rows: list[tuple[Any, ...]], per_shard: int
    ) -> Window:
        """What a claim that read (`read_won` in `statements`) returned: each won key,
        then one of its rows (NULLs for a won shard with no row to read)."""
        lease.shards = sorted({ShardKey(*row[:3]) for row in rows})
        row_id = 3 + len(model.shard_fields)
        read = [row[3:] for row in rows if row[row_id] is not None]
        return self._window(model, read, lease.shards, per_shard)

    def _window(
        self,
        model: type[OutboxBase],
        rows: Sequence[tuple[Any, ...]],
        shards: Sequence[ShardKey],
        per_shard: int,
    ) -> Window:
        groups, newest, read, cut = coalesce(model, rows, shards)
        self._reader(model).attach(newest, len(model.shard_fields) + 5)
        # A shard cut before a row not yet due was read to its end for now (a window's
        # SQL drops the rows past the cut, so its count may fall short of a full share).
        incomplete = {shard for shard, count in read.items() if count >= per_shard} - cut
        return Window(groups, incomplete)

    def _reader(self, model: type[OutboxBase]) -> MessageReader:
        # Django reads jsonb as text and leaves decoding to the field; so do we.
        if model not in self._readers:
            connection = connections[self.using]
            self._readers[model] = MessageReader(model, connection)
        return self._readers[model]

    def settle(self, model: type[OutboxBase], lease: Lease, settlement: Settlement) -> SettleResult:
        if not (settlement.delivered or settlement.failed or settlement.dead or settlement.release):
            return SettleResult()
        released = not (settlement.failed or settlement.dead) and (
            settlement.delivered.keys() <= set(settlement.release)
        )
        deleted, held = self._settle(model, lease, settlement, released=released)
        lost = frozenset(key for key in settlement.delivered if key not in held)
        # Settled shard by shard when released: a lost shard kept its rows, the others
        # are done, so there is nothing to settle again.
        if lost and not released:
            # Some lease was lost, so nothing was deleted or released: settle the held
            # shards again on their own (failures and dead letters were already recorded
            # where held).
            retry = Settlement(
                delivered={k: ids for k, ids in settlement.delivered.items() if k not in lost},
                release=[key for key in settlement.release if key not in lost],
            )
            deleted, _ = self._settle(model, lease, retry)
        return SettleResult(deleted, lost)

    def _settle(
        self, model: type[OutboxBase], lease: Lease, settlement: Settlement, released: bool = False
    ) -> tuple[int, set[ShardKey]]:
        params = settle_params(model, lease, settlement)
        sql = statements(model)
        result = self._fetch(sql.settle_released if released else sql.settle, params)
        # Plain tuples: they compare and hash as the ShardKeys they stand for.
        held = {tuple(row[1:]) for row in result if row[1] is not None}
        return int(result[0][0]), held  # type: ignore[return-value]

    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        params = {"label": model._meta.label_lower, "token": lease.token, "seconds": lease.seconds}
        return {ShardKey(*r) for r in self._fetch(statements(model).renew, params, scalars=True)}

    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        if not shards:
            return
        regions, scopes_in, identifiers_in = key_arrays(shards)
        params = {
            "label": model._meta.label_lower,
            "token": lease.token,
            "regions": regions,
            "scopes_in": scopes_in,
            "identifiers_in": identifiers_in,
        }
        self._fetch(statements(model).release, params)


def _share(shards: int, limit: int) -> int:
    """The rows read per shard: each shard gets its share of the window, read through
    the shard index, so the cost follows the rows read and not the size of the shards.
    At least 100 rows for a batch of up to 100 shards, fewer (never under 2, so a
    one-row shard is read to its end) for a wide batch of small shards, 10,000 rows
    in all at most."""
    count = max(shards, 1)
    return max(limit // count, min(100, max(10_000 // count, 2)))


# Per Django connection: its psycopg connection (weakly) and whether statements outside a
# transaction run under READ COMMITTED there.
_read_committed_by: weakref.WeakKeyDictionary[BaseDatabaseWrapper, tuple[Any, bool]] = (
    weakref.WeakKeyDictionary()
)


def _read_committed(connection: BaseDatabaseWrapper) -> bool:
    """Whether Django runs this connection's transactions under READ COMMITTED and the
    server runs its statements outside a transaction (the engine's) under it too: a
    database or role may set another default. The server is asked once per connection."""
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    if getattr(connection, "isolation_level", None) != IsolationLevel.READ_COMMITTED:
        return False
    raw = connection.connection
    known = _read_committed_by.get(connection)
    if known is None or known[0]() is not raw:
        with connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            level = cursor.fetchone()[0]
        known = _read_committed_by[connection] = (weakref.ref(raw), level == "read committed")
    return bool(known[1])


# --- The cursor the statements run on -------------------------------------------------

# PostgreSQL compiles a plan to machine code (JIT) once its estimated cost passes
# `jit_above_cost`, and compiles it again at every execution. The read of a window of a
# few thousand rows passes that cost, and compiling took about half of each read
# (bench/README.md, "JIT and the window's read"). The statements that read rows turn JIT
# off for themselves: `SET LOCAL` sent with the statement in one
# simple query, which PostgreSQL runs as one implicit transaction, so the setting ends
# with the statement. Only in autocommit (the drain's, and the flush's after commit):
# inside a transaction `SET LOCAL` would last to its end. A server-side binding cursor
# (`prepare_threshold` set) sends one statement at a time, and keeps JIT as configured.
_NO_JIT = "SET LOCAL jit = off;"


@cache
def _psycopg_3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


# Prepared statements for the PostgreSQL fast path, where the connection allows them.
#
# Django leaves psycopg's prepared statements off (`prepare_threshold` None), since a
# transaction-pooling proxy (PgBouncer before 1.21) may send a statement prepared on one
# server session to another. Where the `OPTIONS` of a database set `prepare_threshold`,
# the engine runs its statements on a server-side binding cursor of its own (kept per
# connection, `outbox.internals.kept_cursor`), so psycopg prepares each one after that
# many executions on the connection, whether or not Django binds the project's own
# queries server-side.
#
# A prepared statement is parsed once, and, once PostgreSQL judges a generic plan no
# dearer than planning each call, planned once: planning the claim of a synchronous flush
# costs more than running it. The single-shard claim (`claim_key_read`) takes its key as
# scalars so that its generic plan costs the same as a planned one and is chosen.
#
# Only statements whose parameters are all scalars are prepared (the backend says which):
# a generic plan takes an array parameter for 10 elements, and PostgreSQL's `auto` plan
# cache mode, seeing it no dearer than the plans made for small flushes, kept it for a
# drain's batch of thousands of shards too, where it settled, claimed and read far slower
# than a plan made for the batch (bench/README.md, "Why array statements are not
# prepared", has the figures).


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


# --- The deferred writer's COMMIT sent with its last INSERT ---------------------------
#
# psycopg 3 with client-side binding (Django's default) sends a multi-statement query as
# one message, so `INSERT ...; COMMIT` costs one round trip; psycopg's own commit
# afterwards finds the transaction ended and does nothing. Server-side binding and
# psycopg 2 cannot, so they are offered nothing.


class AppendCommit:
    """The execute wrapper that appends the COMMIT to the INSERT it wraps, and the cursor
    that INSERT runs on (`outbox.cursors.CommitWithInsert`)."""

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not many and sql.lstrip().upper().startswith("INSERT"):
            sql = f"{sql}; COMMIT"
        return execute(sql, params, many, context)

    def cursor(self, driver: Any) -> Any:
        """A cursor that loads timestamptz with psycopg's own loader (its C version where
        installed) instead of Django's, a Python subclass that costs a returned row more
        than the rest of its statement's Python; the write path then sets the tzinfo as
        Django's loader does."""
        from psycopg.types.datetime import TimestamptzLoader

        cursor = driver.cursor()
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        return cursor


def commit_with_last_insert(connection: BaseDatabaseWrapper) -> AppendCommit | None:
    """`AppendCommit` where psycopg 3 binds client-side, else None."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    options = connection.settings_dict.get("OPTIONS", {})
    if not is_psycopg3 or options.get("server_side_binding"):
        return None
    return _APPEND_COMMIT


_APPEND_COMMIT = AppendCommit()


# --- What the statements bind ---------------------------------------------------------

# Parameters of the PostgreSQL fast path's statements: shard keys, row ids and failed
# attempts as array literals (binding a list element by element costs more than the
# statement itself when a batch holds thousands of one-row shards).


def int_array(values: Sequence[int]) -> str:
    """An array literal for `%s::bigint[]`: one string is far cheaper to bind than a list."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Sequence[str]) -> str:
    """An array literal for `%s::text[]`, every element quoted (so "" and NULL are text)."""
    if not any(values):  # region outboxes: every region name is ""
        return "{" + ",".join(['""'] * len(values)) + "}"
    quoted = (value.replace("\\", "\\\\").replace('"', '\\"') for value in values)
    return "{" + ",".join(f'"{value}"' for value in quoted) + "}"


def key_arrays(keys: Sequence[ShardKey]) -> tuple[str, str, str]:
    """Shard keys as three array literals: binding lists element by element costs more
    than the statement itself when a batch holds thousands of one-row shards."""
    if not keys:
        return "{}", "{}", "{}"
    regions, scopes, identifiers = zip(*keys, strict=True)
    return text_array(regions), int_array(scopes), int_array(identifiers)


def key_params(prefix: str, keys: Sequence[ShardKey]) -> dict[str, str]:
    """Shard keys as the three parallel arrays `{prefix}_regions`, `_scopes`, `_identifiers`."""
    return named_arrays(prefix, key_arrays(keys))


def named_arrays(prefix: str, arrays: tuple[str, str, str]) -> dict[str, str]:
    regions, scopes, identifiers = arrays
    return {
        f"{prefix}_regions": regions,
        f"{prefix}_scopes": scopes,
        f"{prefix}_identifiers": identifiers,
    }


def bound_params(prefix: str, key: ShardKey) -> dict[str, Any]:
    return {
        f"{prefix}_region": key.region_name,
        f"{prefix}_scope": key.shard_scope,
        f"{prefix}_identifier": key.shard_identifier,
    }


def attempt_rows(settlement: Settlement) -> dict[str, Any]:
    """The failed and dead rows as parallel arrays: id, delay, error, traceback, the
    receivers done (newest row of a group only, else NULL) and whether it is dead."""
    groups = [(f, False) for f in settlement.failed] + [(f, True) for f in settlement.dead]
    rows = [
        (row_id, delay, f.error, f.traceback, f.delivered_to if row_id == newest else None, dead)
        for f, dead in groups
        for newest in [max(f.row_delays, default=0)]
        for row_id, delay in f.row_delays.items()
    ]
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), (), (), ()]
    return {
        "failed": int_array(columns[0]),
        "delays": list(columns[1]),
        "errors": list(columns[2]),
        "tracebacks": list(columns[3]),
        "done": list(columns[4]),
        "dead": list(columns[5]),
    }


def settle_params(model: type[OutboxBase], lease: Lease, settlement: Settlement) -> dict[str, Any]:
    delivered, failed = settlement.delivered, settlement.failed
    delivered_keys = list(delivered)
    arrays = key_arrays(delivered_keys)
    # The finished shards are often exactly those delivered to: one literal for both.
    released = arrays if list(settlement.release) == delivered_keys else None
    return {
        "label": model._meta.label_lower,
        "token": lease.token,
        "delivered": int_array([row_id for ids in delivered.values() for row_id in ids]),
        "delivered_shards": len(delivered),
        **named_arrays("d", arrays),
        **attempt_rows(settlement),
        **key_params("b", [f.shard for f in failed]),
        "b_delays": [f.block_seconds for f in failed],
        **named_arrays("r", released or key_arrays(settlement.release)),
        "released_shards": len(set(settlement.release)),
    }


def claim_params(
    model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
) -> dict[str, Any]:
    """The parameters of the claim statements (and of the given keys, if any)."""
    params: dict[str, Any] = {
        "label": model._meta.label_lower,
        "limit": limit,
        "scopes": list(where.scopes) if where.scopes else None,
        "identifiers": list(where.identifiers) if where.identifiers else None,
        "token": lease.token,
        "holder": lease.holder,
        "seconds": lease.seconds,
    }
    if where.shards is not None:
        regions, scopes_in, identifiers_in = key_arrays(where.shards)
        params.update(regions=regions, scopes_in=scopes_in, identifiers_in=identifiers_in)
    return params
