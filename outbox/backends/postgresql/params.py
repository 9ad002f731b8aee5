"""Parameters of the PostgreSQL fast path's statements: shard keys, row ids and failed
attempts as array literals (binding a list element by element costs more than the
statement itself when a batch holds thousands of one-row shards)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.backends.base import Lease, Settlement, ShardFilter
from outbox.models import OutboxBase
from outbox.shards import ShardKey


def int_array(values: Sequence[int]) -> str:
    """An array literal for `%s::bigint[]`: one string is far cheaper to bind than a list."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Sequence[str]) -> str:
    """An array literal for `%s::text[]`, every element quoted (so "" and NULL are text)."""
    if not any(values):  # region outboxes: every region name is ""
        return "{" + ",".join(['""'] * len(values)) + "}"
    quoted = (value.replace("\\", "\\\\").replace('"', '\\"') for value in values)
    return "{" + ",".join(f'"{value}"' for value in quoted) + "}"


def key_arrays(keys: Sequence[ShardKey]) -> tuple[str, str, str]:
    """Shard keys as three array literals: binding lists element by element costs more
    than the statement itself when a batch holds thousands of one-row shards."""
    if not keys:
        return "{}", "{}", "{}"
    regions, scopes, identifiers = zip(*keys, strict=True)
    return text_array(regions), int_array(scopes), int_array(identifiers)


def key_params(prefix: str, keys: Sequence[ShardKey]) -> dict[str, str]:
    """Shard keys as the three parallel arrays `{prefix}_regions`, `_scopes`, `_identifiers`."""
    return named_arrays(prefix, key_arrays(keys))


def named_arrays(prefix: str, arrays: tuple[str, str, str]) -> dict[str, str]:
    regions, scopes, identifiers = arrays
    return {
        f"{prefix}_regions": regions,
        f"{prefix}_scopes": scopes,
        f"{prefix}_identifiers": identifiers,
    }


def bound_params(prefix: str, key: ShardKey) -> dict[str, Any]:
    return {
        f"{prefix}_region": key.region_name,
        f"{prefix}_scope": key.shard_scope,
        f"{prefix}_identifier": key.shard_identifier,
    }


def attempt_rows(settlement: Settlement) -> dict[str, Any]:
    """The failed and dead rows as parallel arrays: id, delay, error, traceback, the
    receivers done (newest row of a group only, else NULL) and whether it is dead."""
    groups = [(f, False) for f in settlement.failed] + [(f, True) for f in settlement.dead]
    rows = [
        (row_id, delay, f.error, f.traceback, f.delivered_to if row_id == newest else None, dead)
        for f, dead in groups
        for newest in [max(f.row_delays, default=0)]
        for row_id, delay in f.row_delays.items()
    ]
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), (), (), ()]
    return {
        "failed": int_array(columns[0]),
        "delays": list(columns[1]),
        "errors": list(columns[2]),
        "tracebacks": list(columns[3]),
        "done": list(columns[4]),
        "dead": list(columns[5]),
    }


def settle_params(model: type[OutboxBase], lease: Lease, settlement: Settlement) -> dict[str, Any]:
    delivered, failed = settlement.delivered, settlement.failed
    delivered_keys = list(delivered)
    arrays = key_arrays(delivered_keys)
    # The finished shards are often exactly those delivered to: one literal for both.
    released = arrays if list(settlement.release) == delivered_keys else None
    return {
        "label": model._meta.label_lower,
        "token": lease.token,
        "delivered": int_array([row_id for ids in delivered.values() for row_id in ids]),
        "delivered_shards": len(delivered),
        **named_arrays("d", arrays),
        **attempt_rows(settlement),
        **key_params("b", [f.shard for f in failed]),
        "b_delays": [f.block_seconds for f in failed],
        **named_arrays("r", released or key_arrays(settlement.release)),
        "released_shards": len(set(settlement.release)),
    }


def claim_params(
    model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
) -> dict[str, Any]:
    """The parameters of the claim statements (and of the given keys, if any)."""
    params: dict[str, Any] = {
        "label": model._meta.label_lower,
        "limit": limit,
        "scopes": list(where.scopes) if where.scopes else None,
        "identifiers": list(where.identifiers) if where.identifiers else None,
        "token": lease.token,
        "holder": lease.holder,
        "seconds": lease.seconds,
    }
    if where.shards is not None:
        regions, scopes_in, identifiers_in = key_arrays(where.shards)
        params.update(regions=regions, scopes_in=scopes_in, identifiers_in=identifiers_in)
    return params
