"""The MariaDB fast path (10.6+): a few statements per engine step, whatever the batch size.

- Claiming walks the shard index with a skip scan that stops after enough due, free
  shards (resuming after the last shard claimed, wrapping around), then leases them all
  with one `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`: a missing lease row is
  inserted, an expired one taken over, a live one left alone, and the rows returned say
  which shards were won. The lease table's unique key decides between claimers.
- Reading takes every claimed shard in one statement while they fit the window, and
  decodes only each group's newest payload; when some shard holds more than its share,
  a second read takes the others whole and the bigger ones up to their share.
- Settling deletes the delivered rows in one statement, guarded by a count of our lease
  rows that locks them until the commit; failures, back-offs and releases take one
  statement each.
The walk is a plain read: it takes no locks under any isolation level. The statements
are named and written in `statements`; what they bind (keys, ids and failures as JSON)
and the decoding of what they read are at the end of this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from outbox.backends.base import (
    FailedGroup,
    Lease,
    MessageReader,
    OutboxBackend,
    Settlement,
    SettleResult,
    ShardFilter,
    Window,
    coalesce,
)
from outbox.backends.lock_errors import mariadb_lock_error as is_lock_error
from outbox.backends.mariadb.statements import REGION_COLLATIONS, Regions, Statements, statements
from outbox.models import OutboxBase, ShardLease
from outbox.shards import ShardKey

# Shards read apart (through their own index range) in one window at most; more wait
# for the next window.
MAX_ARMS = 100
# About the most rows one window reads, when a wide batch's shards hold a row or two.
WINDOW_ROWS = 10_000

_regions: dict[tuple[str, str, str], Regions] = {}
_NO_REGIONS = Regions()


class MariaDBBackend(OutboxBackend):
    wide_batches = True
    settles_behind = True

    @classmethod
    def supports(cls, connection: BaseDatabaseWrapper) -> bool:
        """MariaDB 10.6 or later (JSON_TABLE, INSERT ... RETURNING); MySQL has no
        RETURNING and stays on the portable path."""
        if connection.vendor != "mysql":
            return False
        mariadb = getattr(connection, "mysql_is_mariadb", False)
        return bool(mariadb) and tuple(getattr(connection, "mysql_version", ())) >= (10, 6)

    @classmethod
    def lock_error(cls, error: BaseException) -> bool:
        return is_lock_error(error)

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._readers: dict[type[OutboxBase], MessageReader] = {}

    def _fetch(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def _execute(self, sql: str, params: Mapping[str, Any]) -> int:
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def _sql(self, model: type[OutboxBase]) -> Statements:
        # A table without region names compares none: the default collations do.
        if "region_name" not in model.shard_fields:
            return statements(model, _NO_REGIONS)
        connection = connections[self.using]
        cache_key = (self.using, str(connection.settings_dict["NAME"]), model._meta.db_table)
        if cache_key not in _regions:
            tables = (ShardLease._meta.db_table, model._meta.db_table)
            found = {row[0]: row[1:] for row in self._fetch(REGION_COLLATIONS, tables)}
            _regions[cache_key] = Regions(found[tables[0]], found[tables[1]])
        return statements(model, _regions[cache_key])

    # -- claim --------------------------------------------------------------------------

    def claim(
        self, model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
    ) -> list[ShardKey]:
        due = [] if limit <= 0 or where.shards == () else self._due(model, where, limit)
        lease.shards = sorted(self._take(model, lease, due)) if due else []
        return lease.shards

    def _due(self, model: type[OutboxBase], where: ShardFilter, limit: int) -> list[ShardKey]:
        """Due, free shards passing `where`, in key order from its cursor, wrapping."""
        sql = self._sql(model)
        params: dict[str, Any] = {"label": model._meta.label_lower, "limit": limit}
        if where.shards is not None:
            statement = sql.claim_keys[where.scopes, where.identifiers]
            rows = self._fetch(statement, {**params, "keys": key_json(where.shards)})
            return [model.shard_key_of(row) for row in rows]
        if where.after is None:
            rows = self._fetch(sql.walk["", where.scopes, where.identifiers], params)
        else:
            after = where.after
            params.update(b_region=after.region_name, b_scope=after.shard_scope)
            params["b_identifier"] = after.shard_identifier
            rows = self._fetch(sql.walk["after", where.scopes, where.identifiers], params)
            if len(rows) < limit:  # wrap around to the shards up to the cursor
                params["limit"] = limit - len(rows)
                rows += self._fetch(sql.walk["until", where.scopes, where.identifiers], params)
        width = len(model.shard_fields)
        return [model.shard_key_of(row[:width]) for row in rows]

    def _take(self, model: type[OutboxBase], lease: Lease, shards: list[ShardKey]) -> set[ShardKey]:
        params = ours(model, lease, holder=lease.holder, micros=micros(lease.seconds))
        rows = self._fetch(self._sql(model).take, {**params, "keys": key_json(shards)})
        return {ShardKey(*row[:3]) for row in rows if row[3] == lease.token}

    # -- read ---------------------------------------------------------------------------

    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window:
        # Each shard gets its share of the window, as on PostgreSQL: at least 100 rows for
        # a batch of up to 100 shards, fewer (never under 2) for a wide batch.
        count = max(len(shards), 1)
        per_shard = max(limit // count, min(100, max(WINDOW_ROWS // count, 2)))
        keys, cap = key_json(shards), count * per_shard
        rows = self._fetch(self._sql(model).read_small[timed], {"keys": keys, "cap": cap + 1})
        big: list[ShardKey] = []
        if len(rows) > cap:  # some shard holds more than its share
            rows, big = self._read_shares(model, keys, per_shard, timed)
        width = len(model.shard_fields)
        rows.sort(key=itemgetter(width))  # id order, so each shard's rows are in order
        groups, newest, read, cut = coalesce(model, rows, shards)
        self._messages(model, newest, width + 5)
        # Shards read whole are complete; one read apart may go on past its share.
        incomplete = {shard for shard in big[:MAX_ARMS] if read.get(shard, 0) >= per_shard}
        return Window(groups, incomplete - cut | set(big[MAX_ARMS:]))

    def _read_shares(
        self, model: type[OutboxBase], keys: str, per_shard: int, timed: bool
    ) -> tuple[list[tuple[Any, ...]], list[ShardKey]]:
        """Read the shards holding at most their share whole, and the first MAX_ARMS
        bigger ones up to it; returns the rows and the bigger shards."""
        sql = self._sql(model)
        rows = self._fetch(sql.read_window[timed], {"keys": keys, "per_shard": per_shard})
        width = len(model.shard_fields)
        big = [model.shard_key_of(row[:width]) for row in rows if row[-1] is not None]
        rows = [row for row in rows if row[width] is not None]
        if big:
            params: dict[str, Any] = {"per_shard": per_shard}
            for n, shard in enumerate(big[:MAX_ARMS]):
                params.update({f"r{n}": shard.region_name, f"s{n}": shard.shard_scope})
                params[f"i{n}"] = shard.shard_identifier
            rows += self._fetch(sql.read_arms(len(big[:MAX_ARMS]), timed), params)
        return rows, big

    def _messages(self, model: type[OutboxBase], newest: Mapping[Any, Any], at: int) -> None:
        """Give each group its newest row as a Message, decoded as Django decodes it."""
        if model not in self._readers:
            self._readers[model] = message_reader(model, connections[self.using])
        self._readers[model].attach(newest, at)

    # -- settle -------------------------------------------------------------------------

    def settle(self, model: type[OutboxBase], lease: Lease, settlement: Settlement) -> SettleResult:
        if not (settlement.delivered or settlement.failed or settlement.dead or settlement.release):
            return SettleResult()
        # Each statement is guarded by the lease and commits on its own (or joins the
        # caller's transaction), so stopping between them leaves nothing inconsistent.
        deleted, lost = self._retire(model, lease, settlement.delivered)
        failed = [f for f in settlement.failed if f.shard not in lost]
        dead = [f for f in settlement.dead if f.shard not in lost]
        for failures in attempt_documents(failed, dead):
            self._execute(self._sql(model).record_attempts, ours(model, lease, failures=failures))
        if failed:
            backoff = back_off_document(failed)
            self._execute(self._sql(model).back_off, ours(model, lease, keys=backoff))
        self.release(model, lease, [key for key in settlement.release if key not in lost])
        return SettleResult(deleted, frozenset(lost))

    def _retire(
        self, model: type[OutboxBase], lease: Lease, delivered: Mapping[ShardKey, Sequence[int]]
    ) -> tuple[int, set[ShardKey]]:
        """Delete the delivered rows if every shard delivered to is held; if some lease
        was lost, delete those of the held shards alone. Returns (deleted, lost)."""
        if not any(delivered.values()):
            return 0, set()
        if delivered.keys() <= set(lease.shards):
            deleted = self._delete(model, lease, delivered, held=True)
            if deleted:  # the guard passed (fewer than asked: an operator removed some)
                return deleted, set()
        held = self.held(model, lease)
        kept = {key: row_ids for key, row_ids in delivered.items() if key in held}
        deleted = self._delete(model, lease, kept, held=False) if kept else 0
        return deleted, {key for key in delivered if key not in held}

    def _delete(
        self,
        model: type[OutboxBase],
        lease: Lease,
        delivered: Mapping[ShardKey, Sequence[int]],
        held: bool,
    ) -> int:
        ids = json.dumps([row_id for row_ids in delivered.values() for row_id in row_ids])
        params = ours(model, lease, ids=ids, held=len(lease.shards))
        if not held:
            params.update(keys=key_json(delivered), shards=len(delivered))
        return self._execute(self._sql(model).retire[held], params)

    # -- leases -------------------------------------------------------------------------

    def held(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        return {ShardKey(*row) for row in self._fetch(self._sql(model).held, ours(model, lease))}

    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        params = ours(model, lease, micros=micros(lease.seconds))
        if self._execute(self._sql(model).renew, params) == len(lease.shards):
            return set(lease.shards)
        return self.held(model, lease)

    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        """All the shards the lease works on go by its token (when no other row holds
        it), cheaper than by their keys."""
        if not shards:
            return
        sql = self._sql(model)
        if set(shards) == set(lease.shards):
            held = ours(model, lease, held=len(lease.shards))
            if self._execute(sql.release_held, held) == len(lease.shards):
                return
        self._execute(sql.release, ours(model, lease, keys=key_json(shards)))


# --- What the statements bind ---------------------------------------------------------

# Parameters of the MariaDB fast path's statements, and the decoding of what it reads.
#
# Shard keys and failures go as JSON documents, opened by `JSON_TABLE`: one parameter,
# however many shards, far cheaper to bind than thousands of placeholders.

# About the largest JSON document one statement carries: its text, escaped, must stay
# well inside max_allowed_packet (16 MiB by default). A failed group's error and
# traceback alone may take 24 kB, so the failures of a wide batch go in chunks.
DOCUMENT_CHARS = 4_000_000


def key_json(keys: Iterable[ShardKey]) -> str:
    return json.dumps([[key.region_name, key.shard_scope, key.shard_identifier] for key in keys])


def micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def ours(model: type[OutboxBase], lease: Lease, **more: Any) -> dict[str, Any]:
    """Parameters naming the lease: the outbox table's label and the token."""
    return {"label": model._meta.label_lower, "token": lease.token, **more}


def attempt_documents(failed: Sequence[FailedGroup], dead: Sequence[FailedGroup]) -> Iterator[str]:
    """The failed and dead groups as JSON documents of about DOCUMENT_CHARS at most: per
    group its error, traceback, whether it is dead, and its rows (id, retry delay in
    microseconds, and the receivers done on the group's newest row only, else null)."""
    chunk: list[str] = []
    size = 0
    for group, is_dead in [(f, 0) for f in failed] + [(f, 1) for f in dead]:
        newest = max(group.row_delays, default=0)
        rows = [
            [row_id, micros(delay), group.delivered_to if row_id == newest else None]
            for row_id, delay in group.row_delays.items()
        ]
        item = json.dumps([group.error, group.traceback, is_dead, rows])
        if chunk and size + len(item) > DOCUMENT_CHARS:
            yield "[" + ",".join(chunk) + "]"
            chunk, size = [], 0
        chunk.append(item)
        size += len(item)
    if chunk:
        yield "[" + ",".join(chunk) + "]"


def back_off_document(failed: Sequence[FailedGroup]) -> str:
    """The failed shards and how long each backs off, in microseconds."""
    return json.dumps([[*group.shard, micros(group.block_seconds)] for group in failed])


def message_reader(model: type[OutboxBase], connection: BaseDatabaseWrapper) -> MessageReader:
    """How Django turns a read row into a message: `decode_json` for a stock JSONField,
    else each field's own converters (see `field_converter`)."""
    return MessageReader(model, connection)
