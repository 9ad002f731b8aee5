"""The MariaDB fast path's SQL for claiming shards: finding the due, free ones that pass
the drain's filters, by a skip scan of the shard index (`walk`) or among given keys
(`claim_keys`), then leasing them (`take`)."""

from __future__ import annotations

from outbox.backends.mariadb.fragments import SHORT, Fragments


def filters(column: str, values: tuple[int, ...] | None) -> str:
    """An inlined IN list of integers (int() makes them safe to inline)."""
    if not values:
        return ""
    return f" AND {column} IN ({', '.join(str(int(value)) for value in values)})"


class ClaimSql(Fragments):
    def due_and_free(self, alias: str, json: bool = False) -> str:
        """The shard of `alias` has a due head (its oldest pending row) and no live lease.
        Dead rows are skipped: they never block."""
        return f"""
            (SELECT h.`scheduled_for` <= NOW(6) FROM {self.table} h
                WHERE {self.same_shard("h", alias, json)} AND h.`dead_at` IS NULL
                ORDER BY h.`id` LIMIT 1)
            AND NOT EXISTS (SELECT 1 FROM {self.lease} l
                WHERE {self.lease_of("l", alias, json)} AND l.`expires_at` > NOW(6))"""

    def bound(self, which: str) -> str:
        """A range on the shard index, after (exclusive) or up to (inclusive) a key given
        as %(b_region)s, %(b_scope)s, %(b_identifier)s; spelled out, because MariaDB
        does not use a row comparison `(a, b) > (x, y)` as an index range."""
        if not which:
            return ""
        strict, last = (">", ">") if which == "after" else ("<", "<=")
        condition = f"o.`shard_identifier` {last} %(b_identifier)s"  # the last key column
        for column in reversed(self.fields[:-1]):
            param = f"%(b_{SHORT[column]})s"
            condition = (
                f"o.`{column}` {strict} {param} OR (o.`{column}` = {param} AND ({condition}))"
            )
        return f" AND ({condition})"

    def walk(self, which: str, scopes: tuple[int, ...] | None, ids: tuple[int, ...] | None) -> str:
        """The due, free shards in key order, walked with a skip scan of the shard index
        (MIN(id) per shard lets MariaDB jump from shard to shard), stopping at the limit."""
        return f"""
            SELECT {self.cols("o")}, MIN(o.`id`) FROM {self.table} o
            WHERE TRUE{self.bound(which)}{filters("o.`shard_scope`", scopes)}
                {filters("o.`shard_identifier`", ids)}
            GROUP BY {self.cols("o")}
            HAVING {self.due_and_free("o")}
            ORDER BY {self.cols("o")} LIMIT %(limit)s"""

    def claim_keys(self, scopes: tuple[int, ...] | None, ids: tuple[int, ...] | None) -> str:
        """Of the given shards, the due, free ones."""
        return f"""
            SELECT {self.key_cols("k")} FROM {self.keys("keys", "k")}
            WHERE {self.due_and_free("k", json=True)}{filters("k.`shard_scope`", scopes)}
                {filters("k.`shard_identifier`", ids)}
            LIMIT %(limit)s"""

    def _take(self) -> str:
        """Lease the shards: a missing lease row is inserted, an expired one taken over
        (its unique key serializes claimers: the second waits for the first's row and
        then finds it live), a live one left alone. Assignments run left to right, so
        the later ones see whether `token` was just taken."""
        region = "k.`region_name`" if self.has_region else "''"
        taken = "`token` <=> VALUES(`token`)"
        return f"""
            INSERT INTO {self.lease} (`outbox`, `region_name`, `shard_scope`,
                `shard_identifier`, `token`, `holder`, `claimed_at`, `expires_at`)
            SELECT %(label)s, {region}, k.`shard_scope`, k.`shard_identifier`, %(token)s,
                %(holder)s, NOW(6), NOW(6) + INTERVAL %(micros)s MICROSECOND
            FROM {self.keys("keys", "k")}
            ON DUPLICATE KEY UPDATE
                `token` = IF(`expires_at` <= NOW(6), VALUES(`token`), `token`),
                `holder` = IF({taken}, VALUES(`holder`), `holder`),
                `claimed_at` = IF({taken}, VALUES(`claimed_at`), `claimed_at`),
                `expires_at` = IF({taken}, VALUES(`expires_at`), `expires_at`)
            RETURNING `region_name`, `shard_scope`, `shard_identifier`, `token`"""
