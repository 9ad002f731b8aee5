"""The MariaDB fast path's SQL for reading the claimed shards' pending rows: all of them
in one join when the shards are small (`read_small`), else the shards up to a size in one
join (`read_window`) and each bigger one by an index range of its own (`read_arms`)."""

from __future__ import annotations

from outbox.backends.mariadb.fragments import SHORT, Fragments

# Makes MariaDB materialize a derived table (its subquery runs once per row, not once
# per use) without limiting it.
_MATERIALIZE = "LIMIT 18446744073709551615"


class ReadSql(Fragments):
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
            f" {alias}.`scheduled_for` <= NOW(6), {alias}.`payload`, {', '.join(times)},"
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
