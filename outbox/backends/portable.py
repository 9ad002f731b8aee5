"""The portable path: the ORM only, correct on SQLite, PostgreSQL and MariaDB/MySQL.

Exclusivity rests on the unique key of `ShardLease`: a free shard is claimed by
inserting its lease row (a concurrent insert of the same key is ignored), an expired
one by a single UPDATE guarded by `expires_at <= now`, which every database evaluates
against the latest committed row. Lease states come from `ShardLease.objects`; all
times are the database's `Now()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    Case,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Now

from outbox.backends.base import (
    FailedGroup,
    Lease,
    OutboxBackend,
    Settlement,
    SettleResult,
    ShardFilter,
    Window,
    coalesce,
)
from outbox.backends.lock_errors import mariadb_lock_error, postgresql_lock_error
from outbox.models import (
    OutboxBase,
    OutboxPause,
    OutboxPauseQuerySet,
    ShardLease,
    ShardLeaseQuerySet,
    any_shard,
)
from outbox.shards import ShardKey

# SQLite primary result codes: SQLITE_BUSY, SQLITE_LOCKED (extended codes share the low byte).
_SQLITE_LOCKED = frozenset({5, 6})


def db_now_plus(seconds: float) -> ExpressionWrapper[Any]:
    """The database clock plus a delay, as an expression."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def key_set(leases: ShardLeaseQuerySet) -> set[ShardKey]:
    columns = leases.values_list("region_name", "shard_scope", "shard_identifier")
    return {ShardKey(*values) for values in columns}


class PortableBackend(OutboxBackend):
    @classmethod
    def supports(cls, connection: BaseDatabaseWrapper) -> bool:
        return True

    @classmethod
    def lock_error(cls, error: BaseException) -> bool:
        """SQLite's busy and locked errors, and those of every database this path runs
        on that has a backend of its own."""
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _SQLITE_LOCKED:
            return True
        return postgresql_lock_error(error) or mariadb_lock_error(error)

    def leases(self, model: type[OutboxBase]) -> ShardLeaseQuerySet:
        leases: ShardLeaseQuerySet = ShardLease.objects.using(self.using)
        return leases.of(model)

    def rows(self, model: type[OutboxBase]) -> QuerySet[Any]:
        return cast("QuerySet[Any]", model._default_manager.using(self.using))

    def pending(self, model: type[OutboxBase]) -> QuerySet[Any]:
        """Rows the drain may deliver: dead letters are never read or claimed."""
        return cast("QuerySet[Any]", self.rows(model).filter(dead_at__isnull=True))

    def _paused(self, model: type[OutboxBase]) -> Q:
        pauses: OutboxPauseQuerySet = OutboxPause.objects.using(self.using)
        return pauses.covering_rows(model)

    def shard_of_row(self, model: type[OutboxBase]) -> dict[str, Any]:
        """Lookups matching a lease row to the outer outbox row's shard."""
        refs: dict[str, Any] = {name: OuterRef(name) for name in model.shard_fields}
        refs.setdefault("region_name", "")
        return refs

    def ours(self, model: type[OutboxBase], lease: Lease) -> Exists:
        """The outer outbox row's shard is held by `lease`."""
        return Exists(self.leases(model).with_token(lease.token).filter(**self.shard_of_row(model)))

    # -- claim --------------------------------------------------------------------------

    def claim(
        self, model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
    ) -> list[ShardKey]:
        nothing_to_claim = limit <= 0 or where.shards == ()
        due = [] if nothing_to_claim else self.due_shards(model, where, limit)
        if due:
            self.take(model, lease, due)
            won = key_set(self.leases(model).with_token(lease.token))
            due = [key for key in due if key in won]
        lease.shards = sorted(due)
        return lease.shards

    def due_shards(self, model: type[OutboxBase], where: ShardFilter, limit: int) -> list[ShardKey]:
        """Shards whose head (oldest pending row) is due and not paused and that have no
        live lease, oldest head first."""
        shard = {name: OuterRef(name) for name in model.shard_fields}
        before = self.pending(model).filter(**shard, id__lt=OuterRef("id"))
        due = self.pending(model).filter(
            ~Exists(before), ~self._paused(model), scheduled_for__lte=Now()
        )
        if where.shards is not None:
            due = due.filter(model.of_shards(where.shards))
        if where.scopes:
            due = due.filter(shard_scope__in=where.scopes)
        if where.identifiers:
            due = due.filter(shard_identifier__in=where.identifiers)
        live = self.leases(model).live().filter(**self.shard_of_row(model))
        heads = due.filter(~Exists(live)).order_by("id").values_list(*model.shard_fields)
        return [model.shard_key_of(head) for head in heads[:limit]]

    def take(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        """Lease whichever of `shards` are free or expired; a live lease stays."""
        taken = {
            "token": lease.token,
            "holder": lease.holder,
            "expires_at": db_now_plus(lease.seconds),
        }
        # The expiry guard is re-checked on the row itself: two workers cannot both win.
        self.leases(model).expired().of_shards(shards).update(claimed_at=Now(), **taken)
        fresh = [
            ShardLease(
                outbox=model._meta.label_lower,
                region_name=key.region_name,
                shard_scope=key.shard_scope,
                shard_identifier=key.shard_identifier,
                **taken,
            )
            for key in shards
        ]
        ShardLease.objects.using(self.using).bulk_create(fresh, ignore_conflicts=True)

    # -- read ---------------------------------------------------------------------------

    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,  # the model instances read always carry date_added
    ) -> Window:
        columns = (*model.shard_fields, "id", "category", "object_identifier", "attempts", "due")
        ready = Q(scheduled_for__lte=Now()) & ~self._paused(model)
        due = Case(When(ready, then=True), default=False)
        read = self.pending(model).filter(model.of_shards(shards)).annotate(due=due).order_by("id")
        rows = list(read.values_list(*columns)[:limit])
        groups, _, _, cut = coalesce(model, rows, shards)
        # One window for all shards: when it is full, any shard may continue past it.
        incomplete = set(shards) - cut if len(rows) >= limit else set()
        newest_ids = [group.newest_id for shard_groups in groups.values() for group in shard_groups]
        # Model instances: the payload is decoded by its own field. One query (in_bulk
        # would split it into batches on SQLite).
        newest = {row.id: row for row in self.rows(model).filter(id__in=newest_ids)}
        for shard_groups in groups.values():
            for group in shard_groups:
                group.message = newest.get(group.newest_id)
        return Window(groups, incomplete)

    # -- settle -------------------------------------------------------------------------

    def settle(self, model: type[OutboxBase], lease: Lease, settlement: Settlement) -> SettleResult:
        # Each statement is guarded by the lease and commits on its own, so stopping
        # between them leaves nothing inconsistent: a lease kept expires, a rescheduled
        # row waits for its time. (One transaction would, when the connection dies, be
        # closed and reconnected by Django, releasing leases the engine meant to keep.)
        deleted, lost = self.retire(model, lease, settlement)
        self.reschedule(model, lease, [f for f in settlement.failed if f.shard not in lost])
        self.bury(model, lease, [f for f in settlement.dead if f.shard not in lost])
        self.release(model, lease, [key for key in settlement.release if key not in lost])
        return SettleResult(deleted, frozenset(lost))

    def settle_unleased(self, model: type[OutboxBase], settlement: Settlement) -> int:
        """Apply `settlement` with no lease, inside the caller's transaction: the eager
        flush in a test's open transaction (`outbox.engine.eager.deliver_eagerly`), which
        no other connection can see, so nothing needs guarding. Deletes the delivered
        rows, records failed attempts and their retry times, marks dead letters, as
        `settle` does; no lease row is read or written. Returns the rows deleted."""
        ids = [row_id for shard_ids in settlement.delivered.values() for row_id in shard_ids]
        deleted = self.rows(model).filter(id__in=ids)._raw_delete(self.using) if ids else 0
        if settlement.failed:
            self.record_attempt(
                model,
                None,
                settlement.failed,
                scheduled_from=Now(),
                scheduled_for=self._retry_times(settlement.failed),
            )
        if settlement.dead:
            self.record_attempt(model, None, settlement.dead, dead_at=Now())
        return deleted

    def retire(
        self, model: type[OutboxBase], lease: Lease, settlement: Settlement
    ) -> tuple[int, set[ShardKey]]:
        """Delete the delivered rows of held shards; return (deleted, shards lost)."""
        ids = [row_id for shard_ids in settlement.delivered.values() for row_id in shard_ids]
        if not ids:
            return 0, set()
        delivered = self.rows(model).filter(id__in=ids).filter(self.ours(model, lease))
        deleted = delivered._raw_delete(self.using)
        if deleted == len(ids):
            return deleted, set()
        # Fewer rows went than asked: either a lease was lost, or an operator removed
        # rows meanwhile. Only the former is a lost shard.
        held = key_set(self.leases(model).with_token(lease.token))
        return deleted, {key for key in settlement.delivered if key not in held}

    def reschedule(
        self, model: type[OutboxBase], lease: Lease, failures: Sequence[FailedGroup]
    ) -> None:
        """Record a failed attempt on each row; back its shard off, without a holder."""
        if not failures:
            return
        self.record_attempt(
            model,
            lease,
            failures,
            scheduled_from=Now(),
            scheduled_for=self._retry_times(failures),
        )
        # The lease row stays, without a token, until the shard may be retried: its
        # later groups wait out the back-off of its head.
        backoff = [When(any_shard([f.shard]), then=db_now_plus(f.block_seconds)) for f in failures]
        self.leases(model).with_token(lease.token).of_shards(f.shard for f in failures).update(
            token=None, expires_at=Case(*backoff, output_field=DateTimeField())
        )

    @staticmethod
    def _retry_times(failures: Sequence[FailedGroup]) -> Case:
        """Each failed row's new `scheduled_for`: its own delay from now."""
        retry_at = [
            When(id=row_id, then=db_now_plus(delay))
            for failure in failures
            for row_id, delay in failure.row_delays.items()
        ]
        return Case(*retry_at, output_field=DateTimeField())

    def bury(self, model: type[OutboxBase], lease: Lease, dead: Sequence[FailedGroup]) -> None:
        """Record the last attempt on each row of the dead groups and mark them dead."""
        if dead:
            self.record_attempt(model, lease, dead, dead_at=Now())

    def record_attempt(
        self,
        model: type[OutboxBase],
        lease: Lease | None,
        failures: Sequence[FailedGroup],
        **changes: Any,
    ) -> None:
        """One UPDATE of the failed rows of held shards (of any shard without a `lease`:
        `settle_unleased`): attempts, times, error, traceback, and the receivers that
        succeeded (on each group's newest row)."""

        def per_group(attribute: str, column: str) -> Case:
            whens = [
                When(id__in=list(f.row_delays), then=Value(getattr(f, attribute))) for f in failures
            ]
            return Case(*whens, default=F(column), output_field=TextField())

        newest = [
            When(id=max(f.row_delays), then=Value(f.delivered_to)) for f in failures if f.row_delays
        ]
        row_ids = [row_id for failure in failures for row_id in failure.row_delays]
        rows = self.rows(model).filter(id__in=row_ids)
        if lease is not None:
            rows = rows.filter(self.ours(model, lease))
        rows.update(
            attempts=F("attempts") + 1,
            first_attempt_at=Coalesce(F("first_attempt_at"), Now()),
            last_attempt_at=Now(),
            last_error=per_group("error", "last_error"),
            last_traceback=per_group("traceback", "last_traceback"),
            delivered_to=Case(*newest, default=F("delivered_to"), output_field=TextField()),
            **changes,
        )

    # -- leases -------------------------------------------------------------------------

    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        ours = self.leases(model).with_token(lease.token)
        renewed = ours.update(expires_at=db_now_plus(lease.seconds))
        if renewed == len(lease.shards):
            return set(lease.shards)
        return key_set(ours)

    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        if shards:
            self.leases(model).with_token(lease.token).of_shards(shards)._raw_delete(self.using)
