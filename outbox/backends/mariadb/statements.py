"""Every SQL statement of the MariaDB fast path, named, rendered once per outbox table
(`statements`), with the fragments they share.

Keys, ids and failures travel as JSON opened with `JSON_TABLE` (10.6+), whose text
columns would take the connection's collation: region names are declared in the
collation of the column they meet (`Regions`), as two collations cannot be compared.
`Statements` holds them in four parts: the fragments (table names, shard columns, the
shard keys given as a JSON parameter, the joins between outbox rows, lease rows and
those keys); claiming shards (the due, free ones that pass the drain's filters, found by
a skip scan of the shard index, `walk`, or among given keys, `claim_keys`, then leased,
`take`); reading the claimed shards' pending rows (all of them in one join when the
shards are small, `read_small`, else the shards up to a size in one join, `read_window`,
and each bigger one by an index range of its own, `read_arms`); and the end of a round
and the lease (`retire`, `record_attempts`, `back_off`, `release`, `release_held`,
`renew`, `held`). What they bind is made in `backend`, which runs them."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

from outbox.models import OutboxBase, OutboxPause, ShardLease

# The short name of each shard column, in the names of the parameters giving a key.
SHORT = {"region_name": "region", "shard_scope": "scope", "shard_identifier": "identifier"}


# The charset and collation of `region_name` in the lease table and an outbox table.
REGION_COLLATIONS = """
    SELECT TABLE_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'region_name' AND TABLE_NAME IN (%s, %s)"""


class Regions(NamedTuple):
    """The (charset, collation) of region_name in the lease table and in the outbox
    table; unused for a table whose shards have no region. (A tuple: the statements'
    cache hashes it on every look-up.)"""

    lease: tuple[str, str] = ("utf8mb4", "utf8mb4_general_ci")
    rows: tuple[str, str] = ("utf8mb4", "utf8mb4_general_ci")


def filters(column: str, values: tuple[int, ...] | None) -> str:
    """An inlined IN list of integers (int() makes them safe to inline)."""
    if not values:
        return ""
    return f" AND {column} IN ({', '.join(str(int(value)) for value in values)})"


# Makes MariaDB materialize a derived table (its subquery runs once per row, not once
# per use) without limiting it.
_MATERIALIZE = "LIMIT 18446744073709551615"


@cache
def statements(model: type[OutboxBase], regions: Regions) -> Statements:
    return Statements(model, regions)


class Rendered(dict[tuple[Any, ...], str]):
    """Statement texts that inline a drain's filters, by their arguments, each rendered
    the first time it is asked for (a drain keeps its filters, so these stay few)."""

    def __init__(self, render: Callable[..., str]) -> None:
        super().__init__()
        self.render = render

    def __missing__(self, key: tuple[Any, ...]) -> str:
        text = self[key] = self.render(*key)
        return text


class Statements:
    """The named statements for one outbox table: rendered once, but for those that
    inline integers (`walk`, `claim_keys`: filters, rendered once per filters) or vary
    with the count of shards read apart (`read_arms`)."""

    def __init__(self, model: type[OutboxBase], regions: Regions) -> None:
        self.table = f"`{model._meta.db_table}`"
        self.lease = f"`{ShardLease._meta.db_table}`"
        self.pause = f"`{OutboxPause._meta.db_table}`"
        self.label = model._meta.label_lower
        self.fields = model.shard_fields
        self.has_region = "region_name" in model.shard_fields
        self.regions = regions
        self.message_columns = model.message_columns
        self.take = self._take()  # lease the due, free shards found
        self.read_small = {timed: self._read_small(timed) for timed in (False, True)}
        self.read_window = {timed: self._read_window(timed) for timed in (False, True)}
        self.retire = {held: self._retire(held) for held in (False, True)}
        self.record_attempts = self._record_attempts()
        self.back_off = self._back_off()
        self.release = self._release()
        self.release_held = self._release_held()
        self.renew = self._renew()
        self.held = self._held()
        # by (scopes, identifiers); walks by (bound, scopes, identifiers)
        self.claim_keys = Rendered(self._claim_keys)
        self.walk = Rendered(self._walk)

    # --- Fragments shared by the statements

    def keys(self, param: str, alias: str, extra: str = "") -> str:
        """The shard keys of a JSON parameter ([[region, scope, identifier], ...]) as a
        table: `region_name` compares with the lease table, `row_region` with the rows."""
        region = ""
        if self.has_region:
            declare = "`{}` VARCHAR(48) CHARACTER SET {} COLLATE {} PATH '$[0]', "
            region = declare.format("region_name", *self.regions.lease)
            region += declare.format("row_region", *self.regions.rows)
        return (
            f"JSON_TABLE(%({param})s, '$[*]' COLUMNS ({region}"
            f"`shard_scope` INT PATH '$[1]', `shard_identifier` BIGINT PATH '$[2]'{extra})) "
            f"AS {alias}"
        )

    def cols(self, alias: str) -> str:
        return ", ".join(f"{alias}.`{name}`" for name in self.fields)

    def key_cols(self, alias: str) -> str:
        """The shard columns of a JSON key table, named as the outbox names them."""
        region = f"{alias}.`row_region` AS `region_name`, " if self.has_region else ""
        return f"{region}{alias}.`shard_scope`, {alias}.`shard_identifier`"

    def same_shard(self, row: str, other: str, json: bool = False) -> str:
        """Outbox row `row` is in the shard of `other` (a row, or a JSON key table)."""
        parts = [
            f"{row}.`{name}` = {other}.`{name}`" for name in ("shard_scope", "shard_identifier")
        ]
        if self.has_region:
            region = "row_region" if json else "region_name"
            parts.insert(0, f"{row}.`region_name` = {other}.`{region}`")
        return " AND ".join(parts)

    def lease_of(self, lease: str, other: str, json: bool = False) -> str:
        """Lease row `lease` is of the shard of `other` (an outbox row, or JSON keys); an
        outbox region is brought to the lease column's collation if it has another."""
        region = f"{other}.`region_name`" if self.has_region else "''"
        if self.has_region and not json and self.regions.lease != self.regions.rows:
            region = "CONVERT({} USING {}) COLLATE {}".format(region, *self.regions.lease)
        return (
            f"{lease}.`outbox` = %(label)s AND {lease}.`region_name` = {region}"
            f" AND {lease}.`shard_scope` = {other}.`shard_scope`"
            f" AND {lease}.`shard_identifier` = {other}.`shard_identifier`"
        )

    def ready(self, row: str) -> str:
        """Outbox row `row` may be delivered now: due, and no pause
        (`outbox.models.pause`) covers it. The first EXISTS names no row, so MariaDB
        runs it once per statement, and only when this table has a pause at all are
        rows probed one by one. The label is inlined (a model label is an identifier):
        the statements keep their parameters. Regions are compared as bytes: the pause
        table's column may have a collation of its own, and two cannot be compared."""
        region = ""
        if self.has_region:
            region = (
                " AND (p.`region_name` IS NULL"
                f" OR CAST(p.`region_name` AS BINARY) = CAST({row}.`region_name` AS BINARY))"
            )
        return (
            f"({row}.`scheduled_for` <= NOW(6) AND NOT ("
            f"EXISTS (SELECT 1 FROM {self.pause} WHERE `outbox` = '{self.label}')"
            f" AND EXISTS (SELECT 1 FROM {self.pause} p"
            f" WHERE p.`outbox` = '{self.label}' AND p.`shard_scope` = {row}.`shard_scope`"
            " AND (p.`shard_identifier` IS NULL"
            f" OR p.`shard_identifier` = {row}.`shard_identifier`)"
            f"{region} AND (p.`category` IS NULL OR p.`category` = {row}.`category`))))"
        )

    # --- Claiming shards

    def due_and_free(self, alias: str, json: bool = False) -> str:
        """The shard of `alias` has a due, unpaused head (its oldest pending row) and no
        live lease. Dead rows are skipped: they never block."""
        return f"""
            (SELECT {self.ready("h")} FROM {self.table} h
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

    def _walk(self, which: str, scopes: tuple[int, ...] | None, ids: tuple[int, ...] | None) -> str:
        """The due, free shards in key order, walked with a skip scan of the shard index
        (MIN(id) per shard lets MariaDB jump from shard to shard), stopping at the limit."""
        return f"""
            SELECT {self.cols("o")}, MIN(o.`id`) FROM {self.table} o
            WHERE TRUE{self.bound(which)}{filters("o.`shard_scope`", scopes)}
                {filters("o.`shard_identifier`", ids)}
            GROUP BY {self.cols("o")}
            HAVING {self.due_and_free("o")}
            ORDER BY {self.cols("o")} LIMIT %(limit)s"""

    def _claim_keys(self, scopes: tuple[int, ...] | None, ids: tuple[int, ...] | None) -> str:
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

    # --- Reading the claimed shards

    def _row_columns(self, alias: str, timed: bool) -> str:
        """What a read returns per row besides its shard: the times only where the
        message carries them (a control outbox) or a lifecycle receiver measures the lag
        (`timed`), since turning a DATETIME into a Python value costs per row."""
        times = [
            f"{alias}.`{column}`"
            if (timed and column == "date_added") or column in self.message_columns
            else "NULL"
            for column in ("date_added", "scheduled_for")
        ]
        return (
            f"{alias}.`id`, {alias}.`category`, {alias}.`object_identifier`, {alias}.`attempts`,"
            f" {self.ready(alias)}, {alias}.`payload`, {', '.join(times)},"
            f" {alias}.`delivered_to`, {alias}.`message_id`, {alias}.`headers`"
        )

    def _read_small(self, timed: bool) -> str:
        """Every pending row of the shards, in one join, stopped by %(cap)s: when it is
        reached, some shard is bigger than its share and `_read_window` reads again.
        Rows come back for all of a group (its newest row is the message): MariaDB sends
        a text payload as it is, and windows to spare them cost more than they save."""
        return f"""
            SELECT {self.key_cols("k")}, {self._row_columns("o", timed)}
            FROM {self.keys("keys", "k")}
            JOIN {self.table} o ON {self.same_shard("o", "k", True)} AND o.`dead_at` IS NULL
            LIMIT %(cap)s"""

    def _read_window(self, timed: bool) -> str:
        """Every row of the shards holding at most %(per_shard)s rows, in one join; a
        shard holding more (its row at that offset is `beyond`) comes back as one marker
        row without an id, to be read by `read_arms`: a join would read it whole."""
        return f"""
            SELECT {self.key_cols("k")}, {self._row_columns("o", timed)}, k.`beyond`
            FROM (
                SELECT k.*, (SELECT b.`id` FROM {self.table} b
                    WHERE {self.same_shard("b", "k", True)}
                    ORDER BY b.`id` LIMIT 1 OFFSET %(per_shard)s) AS `beyond`
                FROM {self.keys("keys", "k")} {_MATERIALIZE}
            ) k
            LEFT JOIN {self.table} o ON k.`beyond` IS NULL AND {self.same_shard("o", "k", True)}
                AND o.`dead_at` IS NULL"""

    def read_arms(self, count: int, timed: bool) -> str:
        """The first %(per_shard)s pending rows of each of `count` shards, given as
        %(r{n})s, %(s{n})s, %(i{n})s: one index range each, however big the shard."""
        arms = []
        for n in range(count):
            key = {name: f"%({SHORT[name][0]}{n})s" for name in self.fields}  # r0, s0, i0
            shard = ", ".join(f"{key[name]} AS `{name}`" for name in self.fields)
            where = " AND ".join(f"o.`{name}` = {key[name]}" for name in self.fields)
            arms.append(
                f"(SELECT {shard}, {self._row_columns('o', timed)}, NULL FROM {self.table} o"
                f" WHERE {where} AND o.`dead_at` IS NULL ORDER BY o.`id` LIMIT %(per_shard)s)"
            )
        return " UNION ALL ".join(arms)

    # --- The end of a round and the lease

    def _retire(self, held: bool) -> str:
        """Delete the delivered rows (%(ids)s: a JSON list, as an IN list of thousands would
        fall back to a table scan) if every shard delivered to is still ours: `held`
        checks that our lease rows are as many as the shards the lease works on
        (%(held)s, those delivered to among them), else the delivered shards (%(keys)s,
        %(shards)s of them) are counted among our lease rows. The count locks the lease
        rows it reads until the commit: no one takes them over meanwhile."""
        ours = f"""(SELECT COUNT(*) FROM {self.lease} WHERE `outbox` = %(label)s
            AND `token` = %(token)s) = %(held)s"""
        if not held:
            ours = f"""(SELECT COUNT(*) FROM {self.keys("keys", "k")}
                JOIN {self.lease} l ON {self.lease_of("l", "k", json=True)}
                    AND l.`token` = %(token)s) = %(shards)s"""
        return f"""DELETE o FROM JSON_TABLE(%(ids)s, '$[*]' COLUMNS (`id` BIGINT PATH '$')) d
            JOIN {self.table} o ON o.`id` = d.`id` WHERE {ours}"""

    def _record_attempts(self) -> str:
        """Record a failed attempt on the failed and dead rows of held shards: their retry
        time or `dead_at`, and on a group's newest row the receivers done (NULL: keep)."""
        failures = (  # per group, then per row of the group
            "`error` LONGTEXT PATH '$[0]', `tb` LONGTEXT PATH '$[1]', `dead` INT PATH '$[2]', "
            "NESTED PATH '$[3][*]' COLUMNS (`id` BIGINT PATH '$[0]', "
            "`micros` BIGINT PATH '$[1]', `done` LONGTEXT PATH '$[2]')"
        )
        return f"""
            UPDATE JSON_TABLE(%(failures)s, '$[*]' COLUMNS ({failures})) f
            JOIN {self.table} o ON o.`id` = f.`id`
            JOIN {self.lease} l ON {self.lease_of("l", "o")} AND l.`token` = %(token)s
            SET o.`attempts` = o.`attempts` + 1,
                o.`scheduled_from` = IF(f.`dead`, o.`scheduled_from`, NOW(6)),
                o.`scheduled_for` = IF(f.`dead`, o.`scheduled_for`,
                                       NOW(6) + INTERVAL f.`micros` MICROSECOND),
                o.`dead_at` = IF(f.`dead`, NOW(6), NULL),
                o.`first_attempt_at` = COALESCE(o.`first_attempt_at`, NOW(6)),
                o.`last_attempt_at` = NOW(6), o.`last_error` = f.`error`,
                o.`last_traceback` = f.`tb`,
                o.`delivered_to` = COALESCE(f.`done`, o.`delivered_to`)"""

    def _back_off(self) -> str:
        """Failed shards keep their lease row without a holder until they may retry."""
        micros = ", `micros` BIGINT PATH '$[3]'"
        return f"""
            UPDATE {self.keys("keys", "k", micros)}
            JOIN {self.lease} l ON {self.lease_of("l", "k", json=True)}
            SET l.`token` = NULL, l.`expires_at` = NOW(6) + INTERVAL k.`micros` MICROSECOND
            WHERE l.`token` = %(token)s"""

    def _release(self) -> str:
        return f"""
            DELETE l FROM {self.keys("keys", "k")} JOIN {self.lease} l
            ON {self.lease_of("l", "k", json=True)} WHERE l.`token` = %(token)s"""

    def _release_held(self) -> str:
        """All our lease rows, if they are the %(held)s shards the lease works on."""
        return f"""
            DELETE FROM {self.lease} WHERE `outbox` = %(label)s AND `token` = %(token)s
            AND (SELECT COUNT(*) FROM {self.lease} WHERE `outbox` = %(label)s
                 AND `token` = %(token)s) = %(held)s"""

    def _renew(self) -> str:
        return f"""
            UPDATE {self.lease} SET `expires_at` = NOW(6) + INTERVAL %(micros)s MICROSECOND
            WHERE `outbox` = %(label)s AND `token` = %(token)s"""

    def _held(self) -> str:
        return f"""
            SELECT `region_name`, `shard_scope`, `shard_identifier` FROM {self.lease}
            WHERE `outbox` = %(label)s AND `token` = %(token)s"""
