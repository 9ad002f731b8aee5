"""Fragments shared by the PostgreSQL fast path's statements: the table names, shard-key
columns and the joins between outbox rows, lease rows and unnested key arrays."""

from __future__ import annotations

from outbox.models import OutboxBase, ShardLease

# The columns of a shard key as the lease table stores them.
LEASE_KEY = ("region_name", "shard_scope", "shard_identifier")
KEY_TYPES = ("text", "integer", "bigint")


def quote(name: str) -> str:
    return f'"{name}"'


class Fragments:
    """SQL fragments for one outbox table and the lease table."""

    def __init__(self, model: type[OutboxBase]) -> None:
        self.table = quote(model._meta.db_table)
        self.lease = quote(ShardLease._meta.db_table)
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

    def same_lease(self, lease: str, key: str) -> str:
        return " AND ".join(f'{lease}."{column}" = {key}."{column}"' for column in LEASE_KEY)

    def row_cols(self, alias: str) -> str:
        return ", ".join(f"{alias}.{column}" for column in self.cols)

    def unnest_keys(self, alias: str) -> str:
        """unnest of the three key arrays, given as %s parameters."""
        arrays = ", ".join(f"%s::{kind}[]" for kind in KEY_TYPES)
        return f"unnest({arrays}) AS {alias}({', '.join(LEASE_KEY)})"
