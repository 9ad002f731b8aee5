"""Every SQL statement of the PostgreSQL fast path, named, rendered once per outbox table.
Shard keys travel as parallel arrays (`unnest(%s::text[], %s::int[], %s::bigint[])`), so
each statement has one text and one plan however many shards or rows it touches."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from outbox.models import OutboxBase, ShardLease

# The columns of a shard key as the lease table stores them.
LEASE_KEY = ("region_name", "shard_scope", "shard_identifier")
KEY_TYPES = ("text", "integer", "bigint")


@dataclass(frozen=True)
class Statements:
    """The named statements for one outbox table."""

    claim_walk: str  # skip-scan the shards in key order, claim the due, free ones
    claim_walk_after: str  # the same, starting after a key (fairness across calls)
    claim_walk_until: str  # the same, from the start up to a key (the wrap-around)
    claim_keys: str  # of the given keys, claim the due, free ones
    read_window: str  # the first rows of each claimed shard, payload only for the newest
    read_window_timed: str  # the same, with the newest rows' date_added (for the lag)
    settle: str  # delete delivered rows, reschedule failed ones, back off, release
    renew: str  # extend a lease, returning the shards still held
    release: str  # drop a lease on some shards


def _quote(name: str) -> str:
    return f'"{name}"'


@cache
def statements(model: type[OutboxBase]) -> Statements:
    return _Renderer(model).render()


class _Renderer:
    def __init__(self, model: type[OutboxBase]) -> None:
        self.table = _quote(model._meta.db_table)
        self.lease = _quote(ShardLease._meta.db_table)
        self.label = model._meta.label_lower
        # Shard columns are named after their fields (the statements below rely on it).
        self.cols = [_quote(name) for name in model.shard_fields]
        self.has_region = "region_name" in model.shard_fields
        self.message_columns = model.message_columns

    # -- fragments ----------------------------------------------------------------------

    def key_of(self, alias: str) -> str:
        """The lease-shaped key (region_name, shard_scope, shard_identifier) of a row alias."""
        region = f'{alias}."region_name"' if self.has_region else "''::text"
        return f'{region} AS region_name, {alias}."shard_scope", {alias}."shard_identifier"'

    def same_shard(self, row: str, key: str) -> str:
        """`row` (an outbox row) belongs to the shard named by `key` (lease-shaped)."""
        parts = [f'{row}."shard_scope" = {key}."shard_scope"']
        parts.append(f'{row}."shard_identifier" = {key}."shard_identifier"')
        if self.has_region:
            parts.insert(0, f'{row}."region_name" = {key}."region_name"')
        return " AND ".join(parts)

    def same_lease(self, lease: str, key: str) -> str:
        return " AND ".join(f'{lease}."{column}" = {key}."{column}"' for column in LEASE_KEY)

    def row_cols(self, alias: str) -> str:
        return ", ".join(f"{alias}.{column}" for column in self.cols)

    def unnest_keys(self, alias: str) -> str:
        """unnest of the three key arrays, given as %s parameters."""
        arrays = ", ".join(f"%s::{kind}[]" for kind in KEY_TYPES)
        return f"unnest({arrays}) AS {alias}({', '.join(LEASE_KEY)})"

    def due_filter(self, alias: str, head: str | None = None) -> str:
        """A walked or given shard's head (its oldest pending row) is due, it has no live
        lease (`lease_free`), and it passes the filters. Dead rows are skipped: they never
        block. `head`: an alias already holding the shard's first row, if any."""
        first_live = f"""(SELECT o."scheduled_for" <= now() FROM {self.table} o
                    WHERE {self.same_shard("o", alias)} AND o."dead_at" IS NULL
                    ORDER BY o."id" LIMIT 1)"""
        if head is not None:  # a live first row answers without another probe
            first_live = f"""CASE WHEN {head}."dead_at" IS NULL
                THEN {head}."scheduled_for" <= now() ELSE {first_live} END"""
        return f"""
            {first_live}
            AND (%(scopes)s::integer[] IS NULL OR {alias}."shard_scope" = ANY(%(scopes)s))
            AND (%(identifiers)s::bigint[] IS NULL
                 OR {alias}."shard_identifier" = ANY(%(identifiers)s))"""

    def lease_of(self, alias: str) -> str:
        """The shard's lease row, if any: one probe of the unique index. LIMIT keeps it a
        correlated probe: turned into a join, the planner (expecting a single shard) may
        rescan the lease table per shard."""
        return f"""LEFT JOIN LATERAL (
                SELECT l."id", l."expires_at" FROM {self.lease} l
                WHERE l."outbox" = %(label)s AND {self.same_lease("l", alias)} LIMIT 1
            ) lease ON TRUE"""

    @staticmethod
    def lease_free() -> str:
        return '(lease."id" IS NULL OR lease."expires_at" <= now())'

    def walk(self, bound: str) -> str:
        """Recursive skip scan over the shard index: one index probe per shard, not per row.

        PostgreSQL evaluates a recursive CTE only as far as its reader pulls, so the LIMIT
        of the reader ends the walk after enough due shards.
        """
        cols = ", ".join(self.cols)
        bounds = {
            "": "",
            "after": f"AND ({cols}) > ({self.key_params('after')})",
            "until": f"AND ({cols}) <= ({self.key_params('until')})",
        }[bound]
        head = 'o."scheduled_for", o."dead_at"'
        return f"""
            walk AS (
                (SELECT {cols}, "scheduled_for", "dead_at" FROM {self.table} o
                 WHERE TRUE {bounds} ORDER BY {cols}, "id" LIMIT 1)
                UNION ALL
                SELECT step.* FROM walk w CROSS JOIN LATERAL (
                    SELECT {self.row_cols("o")}, {head} FROM {self.table} o
                    WHERE ({self.row_cols("o")}) > ({self.row_cols("w")}) {bounds}
                    ORDER BY {self.row_cols("o")}, o."id" LIMIT 1
                ) step
            ),
            due AS (
                SELECT k.*, lease."id" AS lease_id FROM (
                    SELECT {self.key_of("w")}, w."scheduled_for", w."dead_at" FROM walk w
                ) k {self.lease_of("k")}
                WHERE {self.due_filter("k", head="k")} AND {self.lease_free()}
                LIMIT %(limit)s
            )"""

    def key_params(self, prefix: str) -> str:
        names = ["region", "scope", "identifier"] if self.has_region else ["scope", "identifier"]
        return ", ".join(f"%({prefix}_{name})s" for name in names)

    def given_keys(self) -> str:
        return f"""
            due AS (
                SELECT k.*, lease."id" AS lease_id
                FROM unnest(%(regions)s::text[], %(scopes_in)s::integer[],
                            %(identifiers_in)s::bigint[])
                    AS k(region_name, shard_scope, shard_identifier)
                    {self.lease_of("k")}
                WHERE {self.due_filter("k")} AND {self.lease_free()}
            )"""

    def claim(self) -> str:
        """Take the due shards: retake expired leases (skipping rows another claimer has
        locked) and insert the missing ones; a conflicting insert means someone else won."""
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
            fresh AS (
                INSERT INTO {self.lease} ("outbox", "region_name", "shard_scope",
                    "shard_identifier", "token", "holder", "claimed_at", "expires_at")
                SELECT %(label)s, d.region_name, d.shard_scope, d.shard_identifier,
                    %(token)s, %(holder)s, now(), now() + %(seconds)s * interval '1 second'
                FROM due d
                ON CONFLICT ("outbox", "region_name", "shard_scope", "shard_identifier")
                DO NOTHING
                RETURNING "region_name", "shard_scope", "shard_identifier"
            )
            SELECT * FROM retaken UNION ALL SELECT * FROM fresh"""

    def read_window(self, timed: bool = False) -> str:
        """Payload, times and receivers done go only with each group's newest row: the
        others cost nothing to transfer or decode. Dead rows are never read; a shard stops
        before its first row not yet due (`before_cut`), which is no group's newest."""
        cols = ", ".join(f"r.{column}" for column in self.cols)
        newest = 'r."id" = max(r."id") OVER newest_of_group'
        times = [  # date_added also when timed: the processing lag is measured from it
            f'CASE WHEN {newest} THEN r."{column}" END'
            if (timed and column == "date_added") or column in self.message_columns
            else "NULL::timestamptz"
            for column in ("date_added", "scheduled_for")
        ]
        return f"""
            SELECT {cols}, r."id", r."category", r."object_identifier", r."attempts",
                r.before_cut, CASE WHEN {newest} THEN r."payload" END,
                {", ".join(times)}, CASE WHEN {newest} THEN r."delivered_to" END
            FROM (
                SELECT s.*, bool_and(s."scheduled_for" <= now())
                    OVER (PARTITION BY {self.row_cols("s")} ORDER BY s."id") AS before_cut
                FROM {self.unnest_keys("k")}
                CROSS JOIN LATERAL (
                    SELECT * FROM {self.table} o
                    WHERE {self.same_shard("o", "k")} AND o."dead_at" IS NULL
                    ORDER BY o."id" LIMIT %s
                ) s
            ) r
            WHERE r.before_cut
            WINDOW newest_of_group AS (PARTITION BY {cols}, r."category", r."object_identifier")
            ORDER BY {cols}, r."id\""""

    def settle(self) -> str:
        """One round trip at the end of a round.

        `held` locks our lease rows, so no one can take them over until this commits, and
        reports which shards are still ours. Delivered rows are deleted, and finished
        shards released, only when every shard delivered to is held, which spares a lease
        lookup per row; when a lease was lost the engine settles the held shards again on
        their own. Failed rows (few) are checked one by one.
        """
        return f"""
            WITH {self.settle_held()}, {self.settle_rows()}, {self.settle_leases()}
            SELECT (SELECT count(*) FROM gone), h."region_name", h."shard_scope",
                h."shard_identifier"
            FROM (SELECT 1) one LEFT JOIN held h ON TRUE"""

    def settle_held(self) -> str:
        """Our lease rows, locked, and whether every shard delivered to is among them."""
        return f"""
            held AS (
                SELECT "id", "region_name", "shard_scope", "shard_identifier" FROM {self.lease}
                WHERE "token" = %(token)s AND "outbox" = %(label)s
                FOR UPDATE
            ),
            all_held AS (
                SELECT count(*) = %(delivered_shards)s AS yes FROM held h
                JOIN unnest(%(d_regions)s::text[], %(d_scopes)s::integer[],
                            %(d_identifiers)s::bigint[])
                    AS d(region_name, shard_scope, shard_identifier)
                ON {self.same_lease("h", "d")}
            )"""

    def settle_rows(self) -> str:
        """Delete the delivered rows; record a failed attempt on the failed and the dead
        ones (with their retry time, or `dead_at`), and on a group's newest row the
        receivers already done (NULL: keep)."""
        return f"""
            gone AS (
                DELETE FROM {self.table} o
                WHERE o."id" = ANY(%(delivered)s::bigint[]) AND (SELECT yes FROM all_held)
                RETURNING 1
            ),
            retried AS (
                UPDATE {self.table} o
                SET "attempts" = o."attempts" + 1, "scheduled_from" = now(),
                    "scheduled_for" = now() + f.delay * interval '1 second',
                    "dead_at" = CASE WHEN f.dead THEN now() END,
                    "first_attempt_at" = COALESCE(o."first_attempt_at", now()),
                    "last_attempt_at" = now(), "last_error" = f.error, "last_traceback" = f.tb,
                    "delivered_to" = COALESCE(f.done, o."delivered_to")
                FROM unnest(%(failed)s::bigint[], %(delays)s::float8[], %(errors)s::text[],
                            %(tracebacks)s::text[], %(done)s::text[], %(dead)s::boolean[])
                    AS f(id, delay, error, tb, done, dead)
                WHERE o."id" = f.id
                  AND EXISTS (SELECT 1 FROM held h WHERE {self.same_shard("o", "h")})
                RETURNING 1
            )"""

    def settle_leases(self) -> str:
        """Back failed shards off (no holder until then); release the finished ones."""
        return f"""
            backed_off AS (
                UPDATE {self.lease} l
                SET "token" = NULL, "expires_at" = now() + b.delay * interval '1 second'
                FROM held h JOIN unnest(%(b_regions)s::text[], %(b_scopes)s::integer[],
                                        %(b_identifiers)s::bigint[], %(b_delays)s::float8[])
                    AS b(region_name, shard_scope, shard_identifier, delay)
                    ON {self.same_lease("h", "b")}
                WHERE l."id" = h."id" AND cardinality(%(b_delays)s::float8[]) > 0 -- none: skip
                RETURNING 1
            ),
            released AS (
                DELETE FROM {self.lease} l
                USING held h JOIN unnest(%(r_regions)s::text[], %(r_scopes)s::integer[],
                                         %(r_identifiers)s::bigint[])
                    AS r(region_name, shard_scope, shard_identifier)
                    ON {self.same_lease("h", "r")}
                WHERE l."id" = h."id" AND (SELECT yes FROM all_held)
                RETURNING 1
            )"""

    def render(self) -> Statements:
        claim = self.claim()
        return Statements(
            claim_walk=f"WITH RECURSIVE {self.walk('')}, {claim}",
            claim_walk_after=f"WITH RECURSIVE {self.walk('after')}, {claim}",
            claim_walk_until=f"WITH RECURSIVE {self.walk('until')}, {claim}",
            claim_keys=f"WITH {self.given_keys()}, {claim}",
            read_window=self.read_window(),
            read_window_timed=self.read_window(timed=True),
            settle=self.settle(),
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
                  AND {self.same_lease("l", "r")}""",
        )
