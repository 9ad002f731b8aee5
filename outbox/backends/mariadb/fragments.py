"""Fragments shared by the MariaDB fast path's statements: the table names, the shard
columns, the shard keys given as a JSON parameter, and the joins between outbox rows,
lease rows and those keys.

Keys, ids and failures travel as JSON opened with `JSON_TABLE` (10.6+), whose text
columns would take the connection's collation: region names are declared in the
collation of the column they meet (`Regions`), as two collations cannot be compared."""

from __future__ import annotations

from dataclasses import dataclass

from outbox.models import OutboxBase, ShardLease

# The short name of each shard column, in the names of the parameters giving a key.
SHORT = {"region_name": "region", "shard_scope": "scope", "shard_identifier": "identifier"}

# The charset and collation of `region_name` in the lease table and an outbox table.
REGION_COLLATIONS = """
    SELECT TABLE_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'region_name' AND TABLE_NAME IN (%s, %s)"""


@dataclass(frozen=True)
class Regions:
    """The (charset, collation) of region_name in the lease table and in the outbox
    table; unused for a table whose shards have no region."""

    lease: tuple[str, str] = ("utf8mb4", "utf8mb4_general_ci")
    rows: tuple[str, str] = ("utf8mb4", "utf8mb4_general_ci")


class Fragments:
    """SQL fragments for one outbox table and the lease table."""

    def __init__(self, model: type[OutboxBase], regions: Regions) -> None:
        self.table = f"`{model._meta.db_table}`"
        self.lease = f"`{ShardLease._meta.db_table}`"
        self.fields = model.shard_fields
        self.has_region = "region_name" in model.shard_fields
        self.regions = regions
        self.message_columns = model.message_columns

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
