"""The contract between the drain engine and a database: one small class, two paths.

A backend owns every database operation of the engine for one connection alias: claim
due shards under a lease, read a window of their rows, settle a round (delete what was
delivered, reschedule what failed, release finished shards), renew and release leases.
The engine never writes SQL or ORM queries of its own; `outbox.backends.select` picks
the backend for a database.

What every backend guarantees, whatever its path:

- Every method commits on its own: the engine calls it outside any transaction, and
  what it wrote is committed, and so visible to other workers, when it returns. Called
  inside an atomic block (a transactional receiver retiring its own rows), it joins
  that block instead. A method may run several statements if each one is guarded by
  the lease and leaves a consistent state when the next one never runs.
- "Held" means one thing: the lease row still carries our token. Taking over an expired
  lease replaces the token in one guarded statement, so a token match is all a holder
  checks. A lease that lapsed but was not taken over is still held.
- Times are the database clock (`now()`), never the application server's.
- A backend never imports the engine or the write path; it raises
  NotImplementedError for an operation it cannot do, and does nothing, quietly, for
  one that has nothing to do (empty shards, an empty settlement).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Count, Max

from outbox.backends.listener import WakeListener
from outbox.backends.records import (
    FailedGroup,
    Group,
    HeldLeases,
    Lease,
    Message,
    Settlement,
    SettleResult,
    ShardFilter,
    Window,
)
from outbox.backends.wake import wake_backed_off
from outbox.cursors import CommitWithInsert
from outbox.models import OutboxBase, ShardLease
from outbox.shards import ShardKey

__all__ = [
    "FailedGroup",
    "Group",
    "HeldLeases",
    "Lease",
    "Message",
    "OutboxBackend",
    "SettleResult",
    "Settlement",
    "ShardFilter",
    "Window",
]


class OutboxBackend(ABC):
    """Database operations of the engine for one database alias."""

    # Whether claim, read_window and settle stay one statement each however many shards
    # they touch: the engine may then claim up to OUTBOX_BATCH_ROWS shards at once when
    # its shards hold a row or two each. Else it claims OUTBOX_BATCH_SHARDS at most.
    wide_batches = False
    # Whether `settle` may run on another thread (its own connection) while this
    # backend claims, reads and settles on the drain's: the engine then settles a
    # delivered batch in the background while it works on the next one.
    settles_behind = False

    def __init__(self, using: str) -> None:
        self.using = using

    @classmethod
    @abstractmethod
    def supports(cls, connection: BaseDatabaseWrapper) -> bool:
        """Whether this backend can run on `connection` (vendor and features)."""

    @classmethod
    def commit_with_last_insert(cls, connection: BaseDatabaseWrapper) -> CommitWithInsert | None:
        """Optional, for the write path's deferred writer: an execute wrapper
        (`connection.execute_wrapper`) that sends the COMMIT in the same round trip as
        the INSERT it wraps, with the cursor that INSERT runs on
        (`outbox.cursors.CommitWithInsert`), or None where the database cannot. The
        transaction must end with that statement; the driver's own commit afterwards
        must then be a no-op. Asked of the first backend that supports the database,
        whatever OUTBOX_FAST_PATH says (a capability of the database, not of the drain)."""
        return None

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        """Whether `exc`, or an error behind it (its cause or context), is one the engine
        may retry at once: a deadlock or a lock timeout (`lock_error`)."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            if cls.lock_error(current):
                return True
            current = current.__cause__ or current.__context__
        return False

    @classmethod
    def lock_error(cls, error: BaseException) -> bool:
        """Whether this one driver error is a deadlock or a lock timeout, known by its
        code, never by its text. None is, unless a backend knows its driver's codes."""
        return False

    def listener(self, models: Sequence[type[OutboxBase]]) -> WakeListener | None:
        """Optional: an unconnected listener (`outbox.backends.listener`) that wakes an
        idle drain loop when rows of these tables (all on this database) are committed,
        or None where the database cannot. Asked of the first backend that supports
        the database, whatever OUTBOX_FAST_PATH says."""
        return None

    def after_migrate(self) -> None:
        """Optional: set up what the backend needs in the database beyond the models'
        tables (PostgreSQL's NOTIFY triggers), idempotently. Runs after every `migrate`
        of this database, on the first backend that supports it."""
        return None

    @abstractmethod
    def claim(
        self, model: type[OutboxBase], lease: Lease, where: ShardFilter, limit: int
    ) -> list[ShardKey]:
        """Lease up to `limit` shards of `model` that pass `where`, whose oldest pending
        (not dead) row is due, and that have no live lease (held, or backing off), under
        `lease.token`, expiring `lease.seconds` from now. Shards whose lease expired are taken over.

        Must guarantee that no two claims win one shard, whatever runs concurrently,
        and that the lease is committed on return. Sets `lease.shards` to the shards
        won, in key order, and returns them; no shard won is not an error.
        """

    def claim_and_read(
        self,
        model: type[OutboxBase],
        lease: Lease,
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window | None:
        """Optional: `claim` of the given `shards` (as `ShardFilter(shards=...)`, no
        limit but their count) and `read_window` of the shards won, in one step, which
        spares a synchronous flush a round trip before its first receiver. Sets
        `lease.shards` and returns the window; the read must see every change committed
        before the claim won. None: not possible here, so the engine claims, then reads."""
        return None

    @abstractmethod
    def read_window(
        self,
        model: type[OutboxBase],
        shards: Sequence[ShardKey],
        limit: int,
        *,
        timed: bool = False,
    ) -> Window:
        """Read the first pending rows of `shards` (about `limit` in all), coalesced into
        groups. Dead rows are never read. A shard is read in id order up to its first row
        that is not due yet (its own `scheduled_for`): that row and the shard's later rows
        wait, so nothing is delivered early and order is kept.

        Each group's `message` must carry the payload decoded the way Django decodes
        the model's payload field (its decoder, its converters). Shards that may hold
        more rows than were read are listed in `Window.incomplete`. `timed`: the engine
        measures each message's lag, so each `message` must carry its `date_added`;
        without, a backend may leave it None.
        """

    @abstractmethod
    def settle(self, model: type[OutboxBase], lease: Lease, settlement: Settlement) -> SettleResult:
        """Apply `settlement` where `lease` still holds the shards.

        Must never delete or reschedule rows of a shard whose lease was lost (another
        worker may be delivering them), and must report those shards in
        `SettleResult.lost`; rows an operator removed meanwhile are not a lost lease.
        Failed rows get attempts + 1, first/last attempt times, the error and their
        own retry time; the shard's lease row loses its token and expires when the
        shard may be retried. Dead groups get the same record plus `dead_at`, without a
        back-off. Both write the traceback, and `delivered_to` on the newest row.
        Returns the rows deleted and the shards lost.
        """

    @abstractmethod
    def renew(self, model: type[OutboxBase], lease: Lease) -> set[ShardKey]:
        """Extend the lease by `lease.seconds` from now; return the shards still held."""

    @abstractmethod
    def release(self, model: type[OutboxBase], lease: Lease, shards: Sequence[ShardKey]) -> None:
        """Drop the lease on `shards` where `lease.token` still holds it, so the shards
        may be claimed at once; shards someone else holds are left alone."""

    def held_by_others(
        self, model: type[OutboxBase], where: ShardFilter, holder: str
    ) -> HeldLeases:
        """The leases of shards passing `where` that holders other than `holder` hold
        now: how many, and the latest claim among them. A drain whose claim came back
        empty looks at it to tell a claim race lost (other drains hold shards, and move
        on to new ones) from a backlog done. The ORM does it for every backend: one
        aggregate over the lease table, run only when a claim came back empty."""
        leases = ShardLease.objects.using(self.using).of(model).held().exclude(holder=holder)
        if where.scopes:
            leases = leases.filter(shard_scope__in=where.scopes)
        if where.identifiers:
            leases = leases.filter(shard_identifier__in=where.identifiers)
        found = leases.aggregate(count=Count("id"), latest=Max("claimed_at"))
        return HeldLeases(found["count"], found["latest"])

    def wake(self, model: type[OutboxBase], where: ShardFilter) -> list[ShardKey]:
        """End the back-off of the shards passing `where` that a message reached since
        their last failure, for one early attempt (`outbox.backends.wake`); returns them.
        The ORM does it for every backend: it reads the few backing-off leases."""
        shards, scopes, identifiers = where.shards, where.scopes, where.identifiers
        return wake_backed_off(self.using, model, shards, scopes, identifiers)
