"""The PostgreSQL fast path's SQL for finding the shards a claim takes: due (their
oldest live row is), free (no live lease) and passing the drain's filters, found by a
skip scan of the shard index (`walk`), a plain scan of it (`scan`, for shards of about
one row each) or among given keys (`given_keys`)."""

from __future__ import annotations

from outbox.backends.postgresql.fragments import Fragments


class FindSql(Fragments):
    def first_live_due(self, alias: str) -> str:
        """The first live row of shard `alias` is due (NULL: the shard has none). Dead
        rows are skipped: they never block."""
        return f"""(SELECT o."scheduled_for" <= now() FROM {self.table} o
                    WHERE {self.same_shard("o", alias)} AND o."dead_at" IS NULL
                    ORDER BY o."id" LIMIT 1)"""

    def due_filter(self, alias: str, head: str | None = None) -> str:
        """A walked or given shard's head (its oldest pending row) is due, it has no live
        lease (`lease_free`), and it passes the filters. `head`: an alias already holding
        the shard's first row, if any."""
        first_live = self.first_live_due(alias)
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
        head = 'o."scheduled_for", o."dead_at"'
        return f"""
            {name} AS (
                (SELECT {cols}, "scheduled_for", "dead_at" FROM {self.table} o
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
                SELECT DISTINCT ON ({cols}) {cols}, "scheduled_for", "dead_at" FROM (
                    SELECT {self.row_cols("o")}, o."id", o."scheduled_for", o."dead_at"
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
                    SELECT {self.key_of("w")}, w."scheduled_for", w."dead_at" FROM walk w
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
