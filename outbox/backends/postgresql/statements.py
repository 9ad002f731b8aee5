"""Every SQL statement of the PostgreSQL fast path, named (`Statements`), rendered once
per outbox table (`statements`), with the fragments they share.

Shard keys travel as parallel arrays (`unnest(%s::text[], %s::int[], %s::bigint[])`), so
each statement has one text and one plan however many shards or rows it touches.
`_Renderer` builds them in four parts: the fragments (table names, shard-key columns,
the joins between outbox rows, lease rows and unnested key arrays); finding the shards a
claim takes (due: their oldest live row is; free: no live lease; passing the drain's
filters), by a skip scan of the shard index (`walk`), a plain scan of it (`scan`, for
shards of about one row each) or among given keys (`given_keys`); the settle, one round
trip at the end of a round that deletes the delivered rows, records the failed ones,
backs failed shards off and releases the finished ones under the lock of our lease
rows; and the claim and read statements themselves. What they bind is made in
`backend`, which runs them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache

from outbox.models import OutboxBase, OutboxPause, ShardLease

# The columns of a shard key as the lease table stores them.
LEASE_KEY = ("region_name", "shard_scope", "shard_identifier")


KEY_TYPES = ("text", "integer", "bigint")


def quote(name: str) -> str:
    return f'"{name}"'


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
    claim_walk_read: str  # claim_walk, and read the won shards' first rows (locked)
    claim_walk_read_timed: str  # the same, with the newest rows' date_added
    claim_walk_around_read: str  # claim_walk_around, and read the won shards' first rows
    claim_walk_around_read_timed: str  # the same, with the newest rows' date_added
    read_window: str  # the first rows of each claimed shard, payload only for the newest
    read_window_timed: str  # the same, with the newest rows' date_added (for the lag)
    settle: str  # delete delivered rows, reschedule failed ones, back off, release
    settle_released: str  # the same when nothing failed or died and every shard
    # delivered to is finished
    renew: str  # extend a lease, returning the shards still held
    release: str  # drop a lease on some shards (a row per shard let go)


@cache
def statements(model: type[OutboxBase]) -> Statements:
    rendered = _Renderer(model).render()
    return Statements(**{f.name: _compact(getattr(rendered, f.name)) for f in fields(rendered)})


def _compact(sql: str) -> str:
    """The statement without its comments and with no white space it does not need:
    psycopg parses a statement's text once and keeps it only up to 4,096 characters
    (`MAX_CACHED_STATEMENT_LENGTH`); the claims' indented text was longer and was
    parsed again at every call. Quoted names and string literals are kept as they are."""
    parts = _QUOTED.split(_COMMENT.sub("", sql))  # odd items are quoted
    for index in range(0, len(parts), 2):
        part = parts[index]
        text = _AROUND_PUNCTUATION.sub(r"\1", " ".join(part.split()))
        # A space that parted a word from a quoted one stays.
        if index and part[:1].isspace() and text[:1] not in "(),":
            text = " " + text
        if index < len(parts) - 1 and part[-1:].isspace() and text[-1:] not in "(),":
            text += " "
        parts[index] = text
    return "".join(parts).strip()


_QUOTED = re.compile(r"(\"[^\"]*\"|'[^']*')")
_COMMENT = re.compile(r"--[^\n]*")
_AROUND_PUNCTUATION = re.compile(r" ?([(),]) ?")


class _Renderer:
    """Renders every statement for one outbox table."""

    # --- Fragments shared by the statements

    def __init__(self, model: type[OutboxBase]) -> None:
        self.table = quote(model._meta.db_table)
        self.lease = quote(ShardLease._meta.db_table)
        self.pause = quote(OutboxPause._meta.db_table)
        self.label = model._meta.label_lower
        # Shard columns are named after their fields (the statements below rely on it).
        self.cols = [quote(name) for name in model.shard_fields]
        self.has_region = "region_name" in model.shard_fields
        self.message_columns = model.message_columns

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

    def paused(self, row: str) -> str:
        """A pause (`outbox.models.pause`) covers `row`: an outbox row, or a key-shaped
        alias that carries its head row's category. The first EXISTS names no row, so
        PostgreSQL runs it once per statement (an InitPlan), and only when this table
        has a pause at all are rows probed one by one: without a pause, a read of
        thousands of rows costs one probe of an empty table, not thousands. The label is
        inlined (a model label is an identifier): the statements keep their parameters."""
        region = (
            f'AND (p."region_name" IS NULL OR p."region_name" = {row}."region_name")'
            if self.has_region
            else ""
        )
        return f"""(EXISTS (SELECT FROM {self.pause} WHERE "outbox" = '{self.label}')
            AND EXISTS (SELECT FROM {self.pause} p
                WHERE p."outbox" = '{self.label}' AND p."shard_scope" = {row}."shard_scope"
                  AND (p."shard_identifier" IS NULL
                       OR p."shard_identifier" = {row}."shard_identifier") {region}
                  AND (p."category" IS NULL OR p."category" = {row}."category")))"""

    def ready(self, row: str) -> str:
        """`row` may be delivered now: due, and no pause covers it."""
        return f'({row}."scheduled_for" <= now() AND NOT {self.paused(row)})'

    def same_lease(self, lease: str, key: str) -> str:
        return " AND ".join(f'{lease}."{column}" = {key}."{column}"' for column in LEASE_KEY)

    def row_cols(self, alias: str) -> str:
        return ", ".join(f"{alias}.{column}" for column in self.cols)

    def unnest_keys(self, alias: str) -> str:
        """unnest of the three key arrays, given as %s parameters."""
        arrays = ", ".join(f"%s::{kind}[]" for kind in KEY_TYPES)
        return f"unnest({arrays}) AS {alias}({', '.join(LEASE_KEY)})"

    # --- Finding the shards a claim takes

    def first_live_due(self, alias: str) -> str:
        """The first live row of shard `alias` is due and not paused (NULL: the shard has
        none). Dead rows are skipped: they never block."""
        return f"""(SELECT {self.ready("o")} FROM {self.table} o
                    WHERE {self.same_shard("o", alias)} AND o."dead_at" IS NULL
                    ORDER BY o."id" LIMIT 1)"""

    def due_filter(self, alias: str, head: str | None = None) -> str:
        """A walked or given shard's head (its oldest pending row) is due, it has no live
        lease (`lease_free`), and it passes the filters. `head`: an alias already holding
        the shard's first row, if any."""
        first_live = self.first_live_due(alias)
        if head is not None:  # a live first row answers without another probe
            first_live = f"""CASE WHEN {head}."dead_at" IS NULL
                THEN {self.ready(head)} ELSE {first_live} END"""
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

    def bounds(self, bound: str) -> str:
        """Where a walk or scan of the shard index starts (`after` a key) or ends
        (`until` a key, inclusive); '' for the whole index."""
        cols = ", ".join(self.cols)
        return {
            "": "",
            "after": f"AND ({cols}) > ({self.key_params('after')})",
            "until": f"AND ({cols}) <= ({self.key_params('until')})",
        }[bound]

    def walk(self, bound: str) -> str:
        """Recursive skip scan over the shard index: one index probe per shard, not per row.

        PostgreSQL evaluates a recursive CTE only as far as its reader pulls, so the LIMIT
        of the reader ends the walk after enough due shards. `around` walks the shards
        after a key, then wraps around to those up to it, in one statement: the second
        walk runs only when the first finds too few.
        """
        if bound == "around":
            return f"""{self.steps("walk_after", "after")}, {self.steps("walk_until", "until")},
            walk AS (SELECT * FROM walk_after UNION ALL SELECT * FROM walk_until),
            {self.due_walked()}"""
        return f"{self.steps('walk', bound)}, {self.due_walked()}"

    def steps(self, name: str, bound: str) -> str:
        """The skip scan itself, as CTE `name`: the first row of each shard in key order."""
        cols, bounds = ", ".join(self.cols), self.bounds(bound)
        head = 'o."scheduled_for", o."dead_at", o."category"'
        return f"""
            {name} AS (
                (SELECT {cols}, "scheduled_for", "dead_at", "category" FROM {self.table} o
                 WHERE TRUE {bounds} ORDER BY {cols}, "id" LIMIT 1)
                UNION ALL
                SELECT step.* FROM {name} w CROSS JOIN LATERAL (
                    SELECT {self.row_cols("o")}, {head} FROM {self.table} o
                    WHERE ({self.row_cols("o")}) > ({self.row_cols("w")}) {bounds}
                    ORDER BY {self.row_cols("o")}, o."id" LIMIT 1
                ) step
            )"""

    def scan(self, bound: str) -> str:
        """`walk` and `due` for shards of about one row each: a plain scan of the shard index's
        first %(scan)s entries, keeping each shard's first row (its head), where `walk`
        probes the index again per shard; and no lease lookup before the insert, whose
        conflict finds a lease held, live or expired (the claim goes on with `walk`,
        which takes over expired leases, when this wins too few). Its LIMIT bounds it
        whatever the shards hold."""
        cols = ", ".join(self.cols)
        return f"""
            walk AS (
                SELECT DISTINCT ON ({cols}) {cols}, "scheduled_for", "dead_at", "category" FROM (
                    SELECT {self.row_cols("o")}, o."id", o."scheduled_for", o."dead_at",
                        o."category"
                    FROM {self.table} o WHERE TRUE {self.bounds(bound)}
                    ORDER BY {self.row_cols("o")}, o."id" LIMIT %(scan)s
                ) o ORDER BY {cols}, "id"
            ),
            due AS (
                SELECT {self.key_of("w")} FROM walk w
                WHERE {self.due_filter("w", head="w")}
                LIMIT %(limit)s
            )"""

    def due_walked(self) -> str:
        """The walked shards that are due and free, up to %(limit)s."""
        return f"""
            due AS (
                SELECT k.*, lease."id" AS lease_id FROM (
                    SELECT {self.key_of("w")}, w."scheduled_for", w."dead_at", w."category"
                    FROM walk w
                ) k {self.lease_of("k")}
                WHERE {self.due_filter("k", head="k")} AND {self.lease_free()}
                LIMIT %(limit)s
            )"""

    def key_params(self, prefix: str) -> str:
        names = ["region", "scope", "identifier"] if self.has_region else ["scope", "identifier"]
        return ", ".join(f"%({prefix}_{name})s" for name in names)

    def given_keys(self) -> str:
        """The given keys (three arrays) that are due and free."""
        return f"""
            due AS (
                SELECT k.*, lease."id" AS lease_id
                FROM unnest(%(regions)s::text[], %(scopes_in)s::integer[],
                            %(identifiers_in)s::bigint[]) AS k(region_name, shard_scope,
                                                               shard_identifier)
                    {self.lease_of("k")}
                WHERE {self.due_filter("k")} AND {self.lease_free()}
            )"""

    # --- The settle

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

    def delete_our_leases(self, keys: tuple[str, str, str], returning: str) -> str:
        """Delete this lease's rows (our token) of the shards whose keys come as the
        three array parameters named by `keys`."""
        regions, scopes, identifiers = keys
        return f"""DELETE FROM {self.lease} l
                USING unnest(%({regions})s::text[], %({scopes})s::integer[],
                             %({identifiers})s::bigint[])
                    AS r(region_name, shard_scope, shard_identifier)
                WHERE l."outbox" = %(label)s AND l."token" = %(token)s
                  AND {self.same_lease("l", "r")}
                RETURNING {returning}"""

    def settle_released(self) -> str:
        """The common end of a round, in one cheaper statement: no failed or dead group,
        and every shard delivered to is finished. Deleting our lease rows is the check that we
        still hold them (the delete keeps them locked until it commits, so no one takes
        those shards over meanwhile); only rows of the shards whose lease row went are
        deleted. A shard whose lease was lost keeps its rows; it is missing from the
        shards returned, so the backend reports it lost."""
        released = self.delete_our_leases(
            ("r_regions", "r_scopes", "r_identifiers"),
            'l."region_name", l."shard_scope", l."shard_identifier"',
        )
        return f"""
            WITH released AS ({released}),
            gone AS (
                -- Found by id (never a walk of each shard's rows): every shard held, the
                -- usual case, needs no other check; else a hashed lookup per row.
                DELETE FROM {self.table} o
                WHERE o."id" = ANY(%(delivered)s::bigint[])
                  AND ((SELECT count(*) FROM released) = %(released_shards)s
                       OR ({self.row_cols("o")}) IN (SELECT {self.row_cols("h")}
                                                   FROM released h))
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM gone), h."region_name", h."shard_scope",
                h."shard_identifier"
            FROM (SELECT 1) one LEFT JOIN released h ON TRUE"""

    # --- Claims, reads and the rendering

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
        return self.row_columns(timed, self.ready("r"), lambda value: value)

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
        shard's first row not yet due or paused (`before_cut`)."""
        return f"""
                SELECT s.*, bool_and({self.ready("s")})
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
        return self.read_won(f"WITH {claim}", timed)

    def claim_due_and_read(self, bound: str, timed: bool = False) -> str:
        """`claim_walk` (`bound` "") or `claim_walk_around` ("around"), then the shards
        won read in the same statement as `claim_and_read` reads them, locked for the
        same reason: a loop's round trip saved where writes trickle in."""
        return self.read_won(
            f"""WITH RECURSIVE {self.walk(bound)}, {self.claim_steps()},
            won AS (SELECT * FROM retaken UNION ALL SELECT * FROM fresh)""",
            timed,
        )

    def read_won(self, claim: str, timed: bool) -> str:
        """After `claim` (a WITH clause whose CTE `won` returns the shards won): each won
        key, then its rows, each row read `FOR SHARE` (see `claim_and_read`)."""
        return f"""
            {claim}
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
            claim_walk_read=self.claim_due_and_read(""),
            claim_walk_read_timed=self.claim_due_and_read("", timed=True),
            claim_walk_around_read=self.claim_due_and_read("around"),
            claim_walk_around_read_timed=self.claim_due_and_read("around", timed=True),
            read_window=self.read_window(),
            read_window_timed=self.read_window(timed=True),
            settle=self.settle(),
            settle_released=self.settle_released(),
            renew=f"""
                UPDATE {self.lease}
                SET "expires_at" = now() + %(seconds)s * interval '1 second'
                WHERE "outbox" = %(label)s AND "token" = %(token)s
                RETURNING "region_name", "shard_scope", "shard_identifier\"""",
            release=self.delete_our_leases(("regions", "scopes_in", "identifiers_in"), "1"),
        )
