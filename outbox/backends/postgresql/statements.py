"""Every SQL statement of the PostgreSQL fast path, named, rendered once per outbox table.
Shard keys travel as parallel arrays (`unnest(%s::text[], %s::int[], %s::bigint[])`), so
each statement has one text and one plan however many shards or rows it touches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from outbox.backends.postgresql.find_sql import FindSql
from outbox.backends.postgresql.settle_sql import SettleSql
from outbox.models import OutboxBase


@dataclass(frozen=True)
class Statements:
    """The named statements for one outbox table."""

    claim_walk: str  # skip-scan the shards in key order, claim the due, free ones
    claim_walk_around: str  # the same, after a key (fairness across calls), then wrapping
    # around to the start up to it
    claim_scan: str  # claim_walk by a bounded plain scan (shards of about one row)
    claim_scan_after: str  # the same, starting after a key
    claim_keys: str  # of the given keys, claim the due, free ones
    claim_keys_read: str  # the same, and read the won shards' first rows (locked)
    claim_keys_read_timed: str  # the same, with the newest rows' date_added
    claim_key_read: str  # claim_keys_read for one key (scalars), by one upsert
    claim_key_read_timed: str  # the same, with the newest rows' date_added
    read_window: str  # the first rows of each claimed shard, payload only for the newest
    read_window_timed: str  # the same, with the newest rows' date_added (for the lag)
    settle: str  # delete delivered rows, reschedule failed ones, back off, release
    settle_released: str  # the same when nothing failed or died and every shard
    # delivered to is finished
    renew: str  # extend a lease, returning the shards still held
    release: str  # drop a lease on some shards (a row per shard let go)


@cache
def statements(model: type[OutboxBase]) -> Statements:
    return _Renderer(model).render()


class _Renderer(FindSql, SettleSql):
    """Renders every statement for one outbox table."""

    def claim_one(self) -> str:
        """One given key (three scalars), claimed by one upsert if it is due and its lease
        is missing or expired; `won` returns it if won. A synchronous flush's claim:
        PostgreSQL takes longer to parse and plan `claim_steps` than to run it for one
        key, and this statement spares a flush most of that. Unlike `claim_steps`,
        an expired lease that another claimer has locked is waited for, not skipped, then
        looked at again: taken over, it is not won; deleted, the key is inserted. A lease
        live in the statement's snapshot is not touched. Its generic plan, unlike that of
        the arrays, costs what a planned one does (see `prepared`)."""
        return f"""
            won AS (
                INSERT INTO {self.lease} AS l ("outbox", "region_name", "shard_scope",
                    "shard_identifier", "token", "holder", "claimed_at", "expires_at")
                SELECT %(label)s::text, k.region_name, k.shard_scope, k.shard_identifier,
                    %(token)s::text, %(holder)s::text, now(),
                    now() + %(seconds)s * interval '1 second'
                FROM (VALUES (%(key_region)s::text, %(key_scope)s::integer,
                              %(key_identifier)s::bigint))
                    AS k(region_name, shard_scope, shard_identifier)
                WHERE {self.first_live_due("k")} AND NOT EXISTS (
                    SELECT FROM {self.lease} f
                    WHERE f."outbox" = %(label)s::text AND {self.same_lease("f", "k")}
                      AND f."expires_at" > now())
                ON CONFLICT ("outbox", "region_name", "shard_scope", "shard_identifier")
                DO UPDATE SET "token" = excluded."token", "holder" = excluded."holder",
                    "claimed_at" = excluded."claimed_at", "expires_at" = excluded."expires_at"
                WHERE l."expires_at" <= now()
                RETURNING l."region_name", l."shard_scope", l."shard_identifier"
            )"""

    def claim(self) -> str:
        return f"{self.claim_steps()} SELECT * FROM retaken UNION ALL SELECT * FROM fresh"

    def claim_steps(self) -> str:
        """Take the due shards: retake expired leases (skipping rows another claimer has
        locked) and insert the missing ones; a conflicting insert means someone else won.
        `retaken` and `fresh` return the shards won."""
        return f"""
            expired AS (
                -- The due shards' expired leases, found by `due` (never a scan of the
                -- lease table, which churns); rows another claimer has locked are skipped.
                SELECT l."id" FROM {self.lease} l
                WHERE l."id" = ANY(ARRAY(SELECT d.lease_id FROM due d
                                         WHERE d.lease_id IS NOT NULL))
                  AND l."expires_at" <= now()
                FOR UPDATE SKIP LOCKED
            ),
            retaken AS (
                UPDATE {self.lease} l
                SET "token" = %(token)s, "holder" = %(holder)s, "claimed_at" = now(),
                    "expires_at" = now() + %(seconds)s * interval '1 second'
                FROM expired e WHERE l."id" = e."id"
                RETURNING l."region_name", l."shard_scope", l."shard_identifier"
            ),
            {self.fresh()}"""

    def fresh(self) -> str:
        """Insert the leases of the shards in `due`; a conflicting insert means someone
        else holds the shard (or won it first). `fresh` returns the shards won."""
        return f"""
            fresh AS (
                INSERT INTO {self.lease} ("outbox", "region_name", "shard_scope",
                    "shard_identifier", "token", "holder", "claimed_at", "expires_at")
                SELECT %(label)s, d.region_name, d.shard_scope, d.shard_identifier,
                    %(token)s, %(holder)s, now(), now() + %(seconds)s * interval '1 second'
                FROM due d
                -- Sorted: `due` is then read to its end before the first insert, so its
                -- lease probes never walk the rows this statement inserts (the probe
                -- may be a scan of a lease table small at plan time: quadratic).
                -- Key order: two claims inserting the same keys take them in one order.
                ORDER BY d.region_name, d.shard_scope, d.shard_identifier
                ON CONFLICT ("outbox", "region_name", "shard_scope", "shard_identifier")
                DO NOTHING
                RETURNING "region_name", "shard_scope", "shard_identifier"
            )"""

    def read_columns(self, timed: bool) -> str:
        """What a read returns of each row (`r`): payload, times, receivers done, message
        id and headers go only with each group's newest row (window `newest_of_group`),
        so the others cost nothing to transfer or decode."""
        newest = 'r."id" = max(r."id") OVER newest_of_group'
        return self.row_columns(
            timed, "r.before_cut", lambda value: f"CASE WHEN {newest} THEN {value} END"
        )

    def flush_columns(self, timed: bool) -> str:
        """What a flush's read returns of each row (`r`): every row with its own due
        flag and its payload, so the statement needs no window to parse and plan (which
        cost a flush more than running it): `coalesce` cuts each shard at its first row
        not due and keeps each group's newest payload."""
        return self.row_columns(timed, 'r."scheduled_for" <= now()', lambda value: value)

    def row_columns(self, timed: bool, due: str, message: Callable[[str], str]) -> str:
        """Each row (`r`) as `coalesce` takes it: shard columns, id, category, object,
        attempts and `due`; then payload, times, receivers done, message id and headers,
        each through `message`. date_added also when timed: the processing lag is
        measured from it."""
        times = [
            message(f'r."{column}"')
            if (timed and column == "date_added") or column in self.message_columns
            else "NULL::timestamptz"
            for column in ("date_added", "scheduled_for")
        ]
        return f"""{", ".join(f"r.{column}" for column in self.cols)}, r."id", r."category",
                r."object_identifier", r."attempts", {due}, {message('r."payload"')},
                {", ".join(times)}, {message('r."delivered_to"')}, {message('r."message_id"')},
                {message('r."headers"')}"""

    def shard_rows(self, key: str, limit: str, lock: str = "") -> str:
        """Up to `limit` pending rows of shard `key`, in id order, through the shard index."""
        return f"""
                    SELECT * FROM {self.table} o
                    WHERE {self.same_shard("o", key)} AND o."dead_at" IS NULL
                    ORDER BY o."id" LIMIT {limit} {lock}"""

    def mark_cut(self, rows: str) -> str:
        """`rows` (of one or more shards), each marked whether it comes before its
        shard's first row not yet due (`before_cut`)."""
        return f"""
                SELECT s.*, bool_and(s."scheduled_for" <= now())
                    OVER (PARTITION BY {self.row_cols("s")} ORDER BY s."id") AS before_cut
                FROM ({rows}) s"""

    def read_window(self, timed: bool = False) -> str:
        """The given shards' first rows, up to each one's first row not yet due. The
        rows of all shards are marked in one pass (`mark_cut`), which costs the server
        less than a pass per shard: a fifth of this statement for one-row shards."""
        cols = ", ".join(f"r.{column}" for column in self.cols)
        rows = f"""SELECT s.* FROM {self.unnest_keys("k")}
                    CROSS JOIN LATERAL ({self.shard_rows("k", "%s")}) s"""
        return f"""
            SELECT {self.read_columns(timed)} FROM ({self.mark_cut(rows)}) r
            WHERE r.before_cut
            WINDOW newest_of_group AS (PARTITION BY {cols}, r."category", r."object_identifier")
            ORDER BY {cols}, r."id\""""

    def claim_and_read(self, timed: bool = False, single: bool = False) -> str:
        """Claim the given keys, then read the shards won, in one statement: each won
        key, then its row (NULLs for a shard with no row to read).

        The statement's snapshot predates the claim, so a worker that settled one of
        these shards after it began (deleting rows, or marking them dead) and let it
        go before our claim would leave rows behind in it that are gone. `FOR SHARE`
        makes each row read wait for such a change and look at the row as it is now:
        a deleted row is skipped, a changed one is read again. Right only under READ
        COMMITTED; the backend checks."""
        claim = (
            self.claim_one()
            if single
            else f"""{self.given_keys()}, {self.claim_steps()},
            won AS (SELECT * FROM retaken UNION ALL SELECT * FROM fresh)"""
        )
        return f"""
            WITH {claim}
            SELECT w."region_name", w."shard_scope", w."shard_identifier",
                {self.flush_columns(timed)}
            FROM won w LEFT JOIN LATERAL ({self.shard_rows("w", "%(per_shard)s", "FOR SHARE")}
            ) r ON TRUE
            ORDER BY w."region_name", w."shard_scope", w."shard_identifier", r."id\""""

    def render(self) -> Statements:
        claim = self.claim()
        return Statements(
            claim_walk=f"WITH RECURSIVE {self.walk('')}, {claim}",
            claim_walk_around=f"WITH RECURSIVE {self.walk('around')}, {claim}",
            claim_scan=f"WITH {self.scan('')}, {self.fresh()} SELECT * FROM fresh",
            claim_scan_after=f"WITH {self.scan('after')}, {self.fresh()} SELECT * FROM fresh",
            claim_keys=f"WITH {self.given_keys()}, {claim}",
            claim_keys_read=self.claim_and_read(),
            claim_keys_read_timed=self.claim_and_read(timed=True),
            claim_key_read=self.claim_and_read(single=True),
            claim_key_read_timed=self.claim_and_read(timed=True, single=True),
            read_window=self.read_window(),
            read_window_timed=self.read_window(timed=True),
            settle=self.settle(),
            settle_released=self.settle_released(),
            renew=f"""
                UPDATE {self.lease}
                SET "expires_at" = now() + %(seconds)s * interval '1 second'
                WHERE "outbox" = %(label)s AND "token" = %(token)s
                RETURNING "region_name", "shard_scope", "shard_identifier\"""",
            release=f"""
                DELETE FROM {self.lease} l
                USING unnest(%(regions)s::text[], %(scopes_in)s::integer[],
                             %(identifiers_in)s::bigint[])
                    AS r(region_name, shard_scope, shard_identifier)
                WHERE l."outbox" = %(label)s AND l."token" = %(token)s
                  AND {self.same_lease("l", "r")}
                RETURNING 1""",
        )
