"""The PostgreSQL fast path: each engine step is one statement, whatever the batch size.

- Finding due shards walks the shard index with a recursive skip scan: one index probe
  per shard visited, stopping after enough due shards, so its cost follows the due
  shards and not the backlog. Walks resume after the last claimed shard and wrap around,
  so no part of the key space waits behind another.
- Claiming retakes expired leases with `FOR UPDATE SKIP LOCKED` and inserts missing ones
  with `ON CONFLICT DO NOTHING`, in the same statement as the walk.
- A round ends with one statement that deletes the delivered rows of shards still held,
  reschedules failed rows with per-row values, backs their shards off and releases the
  finished ones, and reports which shards are still held.
The statements themselves live in `postgres_sql`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections

from outbox.backends.base import FailedGroup, Lease, Message, Window, coalesce
from outbox.backends.portable import PortableBackend
from outbox.backends.postgres_sql import statements
from outbox.models import OutboxBase
from outbox.shards import ShardKey

# PostgreSQL prints jsonb without surrounding whitespace: raw_decode skips the checks
# json.loads makes for it, which matter at one call per message.
_decode_json = json.JSONDecoder().raw_decode


def int_array(values: Sequence[int]) -> str:
    """An array literal for `%s::bigint[]`: one string is far cheaper to bind than a list."""
    return "{" + ",".join(map(str, values)) + "}"


def key_arrays(keys: Sequence[ShardKey]) -> tuple[list[str], list[int], list[int]]:
    return (
        [key.region_name for key in keys],
        [key.shard_scope for key in keys],
        [key.shard_identifier for key in keys],
    )


class PostgresBackend(PortableBackend):
    def _fetch(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def _walk_params(
        self,
        model: type[OutboxBase],
        limit: int,
        scopes: Sequence[int] | None,
        identifiers: Sequence[int] | None,
    ) -> dict[str, Any]:
        return {
            "label": model._meta.label_lower,
            "limit": limit,
            "scopes": list(scopes) if scopes else None,
            "identifiers": list(identifiers) if identifiers else None,
        }

    @staticmethod
    def _bound(prefix: str, key: ShardKey) -> dict[str, Any]:
        return {
            f"{prefix}_region": key.region_name,
            f"{prefix}_scope": key.shard_scope,
            f"{prefix}_identifier": key.shard_identifier,
        }

    def find_due_shards(
        self,
        model: type[OutboxBase],
        limit: int,
        *,
        within: Sequence[ShardKey] | None = None,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
    ) -> list[ShardKey]:
        sql = statements(model)
        params = self._walk_params(model, limit, scopes, identifiers)
        if within is not None:
            regions, scopes_in, identifiers_in = key_arrays(within)
            params.update(regions=regions, scopes_in=scopes_in, identifiers_in=identifiers_in)
            return [ShardKey(*row) for row in self._fetch(sql.keys_due, params)]
        return [ShardKey(*row) for row in self._fetch(sql.walk_due, params)]

    def claim_due(
        self,
        model: type[OutboxBase],
        lease: Lease,
        limit: int,
        *,
        within: Sequence[ShardKey] | None = None,
        scopes: Sequence[int] | None = None,
        identifiers: Sequence[int] | None = None,
        after: ShardKey | None = None,
    ) -> None:
        sql = statements(model)
        params = self._walk_params(model, limit, scopes, identifiers)
        params.update(token=lease.token, holder=lease.holder, seconds=lease.seconds)
        if within is not None:
            regions, scopes_in, identifiers_in = key_arrays(within)
            params.update(regions=regions, scopes_in=scopes_in, identifiers_in=identifiers_in)
            won = self._fetch(sql.claim_keys, params)
        elif after is None:
            won = self._fetch(sql.claim_walk, params)
        else:
            won = self._fetch(sql.claim_walk_after, {**params, **self._bound("after", after)})
            if len(won) < limit:  # wrap around to the shards before the cursor
                params["limit"] = limit - len(won)
                won += self._fetch(sql.claim_walk_until, {**params, **self._bound("until", after)})
        lease.shards = sorted(ShardKey(*row) for row in won)

    def claim(self, model: type[OutboxBase], shards: Sequence[ShardKey], lease: Lease) -> None:
        # Claiming named shards is claim_due restricted to them.
        self.claim_due(model, lease, len(shards), within=shards)

    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        params = {"label": model._meta.label_lower, "token": lease.token, "seconds": lease.seconds}
        return {ShardKey(*row) for row in self._fetch(statements(model).renew, params)}

    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
    ) -> Window:
        # Each shard gets its share of the window, read through the shard index, so the
        # cost follows the rows read and not the size of the shards.
        per_shard = max(limit // max(len(shards), 1), 100)
        rows = self._fetch(statements(model).read_window, [*key_arrays(shards), per_shard])
        groups, newest, read = coalesce(model, rows)
        message_at = len(model.shard_fields) + 4
        for group, row in newest.items():
            payload, date_added, scheduled_for = row[message_at:]
            # Django reads jsonb as text and decodes it in the field; do the same here.
            if isinstance(payload, str):
                payload = _decode_json(payload)[0]
            group.message = Message(group, payload, date_added, scheduled_for)
        incomplete = {shard for shard, count in read.items() if count >= per_shard}
        return Window(groups, incomplete)

    def settle(
        self,
        model: type[OutboxBase],
        lease: Lease,
        row_ids: Mapping[ShardKey, Sequence[int]],
        failures: Sequence[FailedGroup],
        release: Sequence[ShardKey],
    ) -> tuple[int, set[ShardKey]]:
        deleted, held = self._settle(model, lease, row_ids, failures, release)
        lost = {key for key in row_ids if key not in held}
        if lost:
            # Some lease was lost, so nothing was deleted or released: settle the held
            # shards again on their own.
            still_held = {key: ids for key, ids in row_ids.items() if key not in lost}
            release = [key for key in release if key not in lost]
            deleted, _ = self._settle(model, lease, still_held, [], release)
        return deleted, lost

    def _settle(
        self,
        model: type[OutboxBase],
        lease: Lease,
        row_ids: Mapping[ShardKey, Sequence[int]],
        failures: Sequence[FailedGroup],
        release: Sequence[ShardKey],
    ) -> tuple[int, set[ShardKey]]:
        failed_rows = [(i, delay, f.error) for f in failures for i, delay in f.row_delays.items()]
        d_regions, d_scopes, d_identifiers = key_arrays(list(row_ids))
        b_regions, b_scopes, b_identifiers = key_arrays([f.shard for f in failures])
        r_regions, r_scopes, r_identifiers = key_arrays(release)
        params = {
            "label": model._meta.label_lower,
            "token": lease.token,
            "delivered": int_array([row_id for ids in row_ids.values() for row_id in ids]),
            "delivered_shards": len(row_ids),
            "d_regions": d_regions,
            "d_scopes": d_scopes,
            "d_identifiers": d_identifiers,
            "failed": int_array([row[0] for row in failed_rows]),
            "delays": [row[1] for row in failed_rows],
            "errors": [row[2] for row in failed_rows],
            "b_regions": b_regions,
            "b_scopes": b_scopes,
            "b_identifiers": b_identifiers,
            "b_delays": [f.block_seconds for f in failures],
            "r_regions": r_regions,
            "r_scopes": r_scopes,
            "r_identifiers": r_identifiers,
        }
        result = self._fetch(statements(model).settle, params)
        held = {ShardKey(*row[1:]) for row in result if row[1] is not None}
        return int(result[0][0]), held

    def retire(
        self, model: type[OutboxBase], lease: Lease, row_ids: Mapping[ShardKey, Sequence[int]]
    ) -> tuple[int, set[ShardKey]]:
        return self.settle(model, lease, row_ids, [], [])

    def reschedule(
        self, model: type[OutboxBase], lease: Lease, failures: Sequence[FailedGroup]
    ) -> None:
        self.settle(model, lease, {}, failures, [])

    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        if not shards:
            return
        regions, scopes_in, identifiers_in = key_arrays(shards)
        params = {
            "label": model._meta.label_lower,
            "token": lease.token,
            "regions": regions,
            "scopes_in": scopes_in,
            "identifiers_in": identifiers_in,
        }
        with connections[self.using].cursor() as cursor:
            cursor.execute(statements(model).release, params)
