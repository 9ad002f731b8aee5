"""The PostgreSQL fast path's settle statement: one round trip at the end of a round
deletes the delivered rows, records the failed ones, backs failed shards off and releases
the finished ones, all under the lock of our lease rows."""

from __future__ import annotations

from outbox.backends.postgresql.fragments import Fragments


class SettleSql(Fragments):
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

    def settle_released(self) -> str:
        """The common end of a round, in one cheaper statement: no failed or dead group,
        and every shard delivered to is finished. Deleting our lease rows is the check that we
        still hold them (the delete keeps them locked until it commits, so no one takes
        those shards over meanwhile); only rows of the shards whose lease row went are
        deleted. A shard whose lease was lost keeps its rows; it is missing from the
        shards returned, so the backend reports it lost."""
        return f"""
            WITH released AS (
                DELETE FROM {self.lease} l
                USING unnest(%(r_regions)s::text[], %(r_scopes)s::integer[],
                             %(r_identifiers)s::bigint[])
                    AS r(region_name, shard_scope, shard_identifier)
                WHERE l."outbox" = %(label)s AND l."token" = %(token)s
                  AND {self.same_lease("l", "r")}
                RETURNING l."region_name", l."shard_scope", l."shard_identifier"
            ),
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
