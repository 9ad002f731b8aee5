"""A drain's pipeline beneath the delivery: the collector paused while it reads and
delivers, the leases it holds while receivers run, the lifecycle events it sends, what
each round did and how it is settled, and a backlog's claims ahead and settles behind.
Each part below needs only the parts above it.

The collector paused
--------------------
Reading a window, and delivering it to receivers that return at once, with Python's
cyclic garbage collector paused.

A window of a few thousand rows builds tens of thousands of small objects (row tuples,
groups, messages) that all stay alive until the window is delivered. Building them
with the collector on makes it run again and again over objects that cannot be garbage,
and promotes them until a full collection walks every object of the process (all of
Django's, in a worker); the bench's CPU section shows what that costs. None of these
objects form cycles, so reference counting frees them when the window is done; nothing
is left for the collector to find.

The same holds while a window is delivered to receivers that return at once: each call
makes its keyword arguments and the receiver's own objects, and with the collector on
those allocations set it running over the window's objects again and again (and, with a
receiver that keeps what it is given, over all it kept). So the drain delivers a window
paused too, but only once it has seen its receivers return at once: the window before
averaged under `SLOW_CALL_SECONDS` a call and did not need the other slots
(`outbox.engine.drain`). A drain's first window, the flush, and every window of
receivers that wait are delivered with the collector on. Should receivers turn slow
inside a paused window, or pauses of several threads overlap, the lease keeper turns
the collector back on once a pause has lasted `LONGEST_PAUSE_SECONDS`; what cyclic
garbage fast receivers made meanwhile is collected then.

The pause nests across threads (a synchronous flush in one thread while a drain reads in
another) and leaves the collector alone when the process turned it off itself.

Holding leases
--------------
Holding leases while receivers run, letting them go, and retrying the short
statements that do both.

One daemon thread per process (`LeaseKeeper`) renews every lease a third of its length
after the last renewal, so a slow receiver delays only its own shard. A receiver that
runs past OUTBOX_RECEIVER_DEADLINE_SECONDS is taken as hung: its lease is no longer
renewed and expires, and another worker retries the shard.

Lifecycle events
----------------
Lifecycle signals of the drain that are not failures: a message processed, a lease
lost. Each is sent only when it has a receiver, so an unused signal costs one check.

What a round did
----------------
What a drain did (`DrainStats`: summaries, logs, tests), what one window's delivery
did (`Round`, settled as one statement), and which shards a round is done with.

A backlog's pipeline
--------------------
The next batches are claimed ahead, and each delivered batch
is settled behind, on helper threads, while the drain reads and delivers the current one.

In a backlog a drain's time goes to four things in turn: claiming a batch, reading it,
delivering it, and settling it. Claiming ahead (`ClaimAhead`) and settling behind
(`SettleBehind`) let the database do the first and the last while Python delivers.
Both run on a `JobThread`: one daemon thread with database connections of its own,
closed when it ends; a job in flight never holds up the process's exit (its
transaction rolls back, and its batch is redelivered).

Claims ahead: two wait at a time (`CLAIMS_AHEAD` in `outbox.engine.drain`), so the
claiming thread never waits for the drain between them. A batch claimed ahead is leased
and handed to the lease keeper as soon as it is won, so it is renewed even if the
batches before it take long. A drain that stops, fails or finds the backlog done before
it works on such a batch releases its shards. A claim made ahead that won nothing may be
older than the settle that released shards with new rows: the drain claims again rather
than end on it.

Settles behind: a drain that finds another batch hands the settle of the batch it has
just delivered (delete its rows, record its failures, release its shards) to the thread.
At most one settle is in flight; the drain waits for it before handing over another,
and before it returns, so its statistics and effects are complete on return. The shards
stay leased (and renewed) until their settle releases them, so no worker claims them in
between, and the settle is guarded by the lease. A process killed before the settle
commits redelivers that batch, as one killed just before a synchronous settle would.

Only a drain that has found two full batches in a row (a backlog) does either, and only
on backends that say so (`OutboxBackend.settles_behind`: the fast paths of PostgreSQL
and MariaDB) while `OUTBOX_SETTLE_IN_BACKGROUND` is on.
"""

from __future__ import annotations

import contextvars
import gc
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any, TypeVar

from django.db import connections
from django.utils import timezone

from outbox.backends.base import (
    FailedGroup,
    Group,
    Lease,
    OutboxBackend,
    Settlement,
    SettleResult,
    Window,
)
from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.models import OutboxBase
from outbox.shards import ShardKey
from outbox.signals import lease_lost, message_processed, receivers_stuck, shards_claimed

logger = logging.getLogger("outbox.engine")

_T = TypeVar("_T")


# --- The collector paused -------------------------------------------------------------

LONGEST_PAUSE_SECONDS = 1.0

_collector_lock = threading.Lock()
_collector_users = 0
_paused_at: float | None = None  # when this module paused the collector; None: it did not


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the block runs (see the module doc)."""
    global _collector_users, _paused_at
    with _collector_lock:
        if _collector_users == 0 and gc.isenabled():
            gc.disable()
            _paused_at = time.monotonic()
        _collector_users += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_users -= 1
            if _collector_users == 0 and _paused_at is not None:
                _paused_at = None
                gc.enable()


def end_long_pause(now: float) -> None:
    """Turn the collector back on if it has been paused `LONGEST_PAUSE_SECONDS` or more
    (the lease keeper looks at every tick); the blocks still running go on unpaused."""
    global _paused_at
    if _paused_at is None or now - _paused_at < LONGEST_PAUSE_SECONDS:
        return
    with _collector_lock:
        if _paused_at is not None:
            _paused_at = None
            gc.enable()


# --- Holding leases -------------------------------------------------------------------


@dataclass(eq=False)
class Holding:
    """A lease as the keeper sees it; `lost` is filled in when renewal fails."""

    backend: OutboxBackend
    model: type[OutboxBase]
    lease: Lease
    renewed_at: float = field(default_factory=time.monotonic)
    receiver_started: float | None = None
    lost: set[ShardKey] = field(default_factory=set)
    # A straggler's task (`outbox.engine.delivery`), whose calls the deadline watches
    # instead of `receiver_started`.
    call: Any = None
    group: Any = None  # the group of the call running now, for `slots.running_calls`

    def begin_call(self, group: object) -> float:
        """A receiver call starts (the drain's own thread): the keeper watches it."""
        self.group = group
        started = self.receiver_started = time.monotonic()
        return started

    def end_call(self) -> None:
        self.receiver_started = None

    def needs_renewal(self, now: float) -> bool:
        return now - self.renewed_at >= self.lease.seconds / 3

    def renewal_overdue(self, now: float) -> bool:
        """The keeper should have renewed by now (it stops for a hung receiver, and may
        fall behind): the lease may be close to expiring, or gone."""
        return now - self.renewed_at >= self.lease.seconds / 2

    def hung(self, now: float) -> bool:
        started = self.receiver_started if self.call is None else self.call.receiver_started
        deadline = outbox_settings.RECEIVER_DEADLINE_SECONDS
        return started is not None and now - started > deadline


class LeaseKeeper:
    _instance: LeaseKeeper | None = None
    _instance_pid = 0
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> LeaseKeeper:
        """The keeper of this process (a forked child starts its own)."""
        with cls._instance_lock:
            if cls._instance is None or cls._instance_pid != os.getpid():
                cls._instance = cls()
                cls._instance_pid = os.getpid()
            return cls._instance

    def __init__(self) -> None:
        self._holdings: set[Holding] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, holding: Holding) -> None:
        with self._lock:
            self._holdings.add(holding)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="outbox-lease-keeper", daemon=True
                )
                self._thread.start()

    def drop(self, holding: Holding) -> None:
        with self._lock:
            self._holdings.discard(holding)

    def holdings(self) -> list[Holding]:
        """The leases held now (read-only: the calls running, for the drain's beacon)."""
        with self._lock:
            return list(self._holdings)

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            end_long_pause(time.monotonic())
            with self._lock:
                holdings = list(self._holdings)
            if holdings:
                self.renew_due(holdings)

    def renew_due(self, holdings: list[Holding]) -> None:
        now = time.monotonic()
        due = [h for h in holdings if h.needs_renewal(now) and not h.hung(now)]
        if not due:
            return  # no statement: no connection to close either
        try:
            for holding in due:
                self._renew(holding)
        finally:
            # This thread is idle most of the time: hold no connection between rounds.
            connections.close_all()

    def _renew(self, holding: Holding) -> None:
        try:
            held = holding.backend.renew(holding.model, holding.lease)
        except Exception:
            logger.warning("outbox lease renewal failed; will retry", exc_info=True)
            return
        holding.renewed_at = time.monotonic()
        holding.lost.update(key for key in holding.lease.shards if key not in held)


def retrying(backend: OutboxBackend, operation: Callable[[], _T]) -> _T:
    """Run a short engine statement, retrying the errors the backend calls transient
    (deadlocks and lock timeouts)."""
    for attempt in range(5):
        try:
            return operation()
        except Exception as exc:
            if attempt == 4 or not backend.is_transient(exc):
                raise
            time.sleep(0.01 * 2**attempt)
    raise AssertionError("unreachable")


def release_quietly(backend: OutboxBackend, model: type[OutboxBase], lease: Lease) -> bool:
    """Release the lease's shards, retrying lock errors; False, with a warning logged,
    if that failed: the leases expire by themselves, and the error that brought the
    caller here matters more."""
    try:
        retrying(backend, lambda: backend.release(model, lease, lease.shards))
    except Exception:
        logger.warning("outbox could not release leases %s", lease.token, exc_info=True)
        return False
    return True


# --- Lifecycle events -----------------------------------------------------------------


def lag_seconds(group: Group) -> float | None:
    """The newest row's age now, from its `date_added` (database clock); None when the
    read did not carry it (a backend is not obliged to)."""
    added = getattr(group.message, "date_added", None)
    if not isinstance(added, datetime):
        return None
    if timezone.is_naive(added):
        added = timezone.make_aware(added, dt_timezone.utc)
    return max((timezone.now() - added).total_seconds(), 0.0)


def wants_processed(model: type[OutboxBase]) -> bool:
    """Whether `message_processed` has a receiver for `model` (checked once per window:
    the check costs more than a delivery's bookkeeping; `receivers` first, as with no
    receiver at all, the usual case, `has_listeners` still looks them up)."""
    return bool(message_processed.receivers) and message_processed.has_listeners(model)


def report_processed(model: type[OutboxBase], group: Group, duration: float, using: str) -> None:
    if not wants_processed(model):
        return
    send_processed(model, group, duration, using)


def send_processed(
    model: type[OutboxBase],
    group: Group,
    duration: float,
    using: str,
    receiver_seconds: dict[str, float] | None = None,
) -> None:
    message_processed.send(
        sender=model,
        shard=group.shard,
        category=group.category,
        object_identifier=group.object_identifier,
        rows=len(group.row_ids),
        lag_seconds=lag_seconds(group),
        duration_seconds=duration,
        receiver_seconds=receiver_seconds or {},
        using=using,
    )


def report_claimed(model: type[OutboxBase], shards: int, duration: float, using: str) -> None:
    if shards_claimed.receivers and shards_claimed.has_listeners(model):
        shards_claimed.send(sender=model, shards=shards, duration_seconds=duration, using=using)


def report_leases_lost(model: type[OutboxBase], shards: set[ShardKey], using: str) -> None:
    for key in sorted(shards):
        logger.warning(
            "outbox lease lost on shard %s before its delete; it will be redelivered",
            registry.shard_name(key, "noted"),
            extra={
                "event": "outbox.lease_lost",
                "outbox": model._meta.label,
                "scope": key.shard_scope,
                "shard": str(key),
            },
        )
        if lease_lost.receivers and lease_lost.has_listeners(model):
            lease_lost.send(sender=model, shard=key, using=using)


def report_stuck(model: type[OutboxBase], count: int, using: str) -> None:
    """The number of this process's stuck receiver threads changed to `count`."""
    if not (receivers_stuck.receivers and receivers_stuck.has_listeners(model)):
        return
    try:
        receivers_stuck.send(sender=model, count=count, using=using)
    except Exception:  # sent from a slot thread on its way out, too
        logger.exception("A receivers_stuck receiver failed")


# --- What a round did ---------------------------------------------------------------


@dataclass
class DrainStats:
    shards: int = 0
    receiver_calls: int = 0
    groups_delivered: int = 0
    rows_retired: int = 0
    failures: int = 0  # failed deliveries kept for a retry
    retried_later: int = 0  # of which every failing receiver asked for it (RetryLater)
    dead_lettered: int = 0  # messages given up as dead letters
    leases_lost: int = 0
    timed_out: int = 0  # sync receiver calls given up at the timeout (threads stuck)
    seconds: float = 0.0
    failed_keys: list[ShardKey] = field(default_factory=list)

    @property
    def progressed(self) -> bool:
        """Whether anything was delivered, retired, failed or given up."""
        return bool(self.receiver_calls or self.rows_retired or self.failures or self.dead_lettered)

    @property
    def coalesced(self) -> int:
        """Rows retired without a receiver call of their own (older rows of a group)."""
        return max(self.rows_retired - self.groups_delivered, 0)

    @property
    def failed_shards(self) -> list[str]:
        """The shards that failed and wait for a retry, once each, in shard key order
        (numeric, not text: shard 2 before shard 10)."""
        return [str(key) for key in sorted(set(self.failed_keys))]

    def add(self, other: DrainStats) -> None:
        for item in fields(self):
            if item.name == "failed_keys":
                self.failed_keys.extend(other.failed_keys)
            elif item.name != "seconds":
                setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def summary(self) -> str:
        return (
            f"shards {self.shards}, receiver calls {self.receiver_calls}, "
            f"rows retired {self.rows_retired} ({self.coalesced} coalesced), "
            f"failures {self.failures}"
            + (f" ({self.retried_later} asked to retry later)" if self.retried_later else "")
            + f", dead-lettered {self.dead_lettered}, "
            f"leases lost {self.leases_lost}, "
            + (f"receiver calls timed out {self.timed_out}, " if self.timed_out else "")
            + f"{self.seconds:.2f}s"
        )


@dataclass
class Round:
    """What one window's delivery did; settled even if a receiver interrupts it."""

    delivered: dict[ShardKey, list[int]] = field(default_factory=dict)
    failures: list[FailedGroup] = field(default_factory=list)
    dead: list[FailedGroup] = field(default_factory=list)
    lost: set[ShardKey] = field(default_factory=set)
    receiver_calls: int = 0
    groups_delivered: int = 0
    retired_inline: int = 0
    # Shards carved out still running on a slot: settled on their own (stragglers).
    running: set[ShardKey] = field(default_factory=set)

    def settlement(self, done: list[ShardKey]) -> Settlement:
        """What settling this round does: delete what it delivered, record its failures
        and dead letters, and release the shards in `done`."""
        return Settlement(
            delivered=self.delivered, failed=self.failures, release=done, dead=self.dead
        )

    def merge(self, other: Round) -> None:
        """Add what `other` did, a round of other shards, to this one."""
        if other.delivered:
            self.delivered.update(other.delivered)
        if other.failures or other.dead or other.lost:
            self.failures.extend(other.failures)
            self.dead.extend(other.dead)
            self.lost.update(other.lost)
        self.receiver_calls += other.receiver_calls
        self.groups_delivered += other.groups_delivered
        self.retired_inline += other.retired_inline

    def without(self, shard: ShardKey) -> Round:
        """This round but for what it did on `shard` (its counters kept as they are)."""
        part = Round(
            delivered={key: ids for key, ids in self.delivered.items() if key != shard},
            failures=[failure for failure in self.failures if failure.shard != shard],
            dead=[failure for failure in self.dead if failure.shard != shard],
            lost=self.lost - {shard},
        )
        part.receiver_calls = self.receiver_calls
        part.groups_delivered = self.groups_delivered
        part.retired_inline = self.retired_inline
        return part

    def only(self, shard: ShardKey, since: Round) -> Round:
        """What this round did on `shard`, counting only the calls made after `since`
        (an earlier copy of this round whose counters were counted already)."""
        part = Round(
            delivered={shard: list(self.delivered[shard])} if shard in self.delivered else {},
            failures=[failure for failure in self.failures if failure.shard == shard],
            dead=[failure for failure in self.dead if failure.shard == shard],
            lost=self.lost & {shard},
        )
        part.receiver_calls = self.receiver_calls - since.receiver_calls
        part.groups_delivered = self.groups_delivered - since.groups_delivered
        part.retired_inline = self.retired_inline - since.retired_inline
        return part

    def copy(self) -> Round:
        """A copy whose row-id lists are its own (the original may still grow)."""
        copied = Round()
        copied.merge(self)
        copied.delivered = {shard: list(ids) for shard, ids in self.delivered.items()}
        return copied

    def add_to(self, stats: DrainStats, deleted: int) -> None:
        """Count this round, whose settlement deleted `deleted` rows, into `stats`."""
        stats.receiver_calls += self.receiver_calls
        stats.groups_delivered += self.groups_delivered
        stats.rows_retired += deleted + self.retired_inline
        stats.failures += len(self.failures)
        stats.retried_later += sum(failure.asked_later for failure in self.failures)
        stats.dead_lettered += len(self.dead)
        stats.leases_lost += len(self.lost)
        stats.failed_keys.extend(failure.shard for failure in self.failures)


def cut_at_bounds(window: Window, bounds: Mapping[ShardKey, int | None]) -> set[ShardKey]:
    """A flush delivers the groups whose oldest pending row is at most its shard's bound
    (the newest row its transaction wrote), each with its newest payload even when that
    row came later; it stops at the first group that began after the bound, so a busy
    shard cannot keep the request flushing. Returns the shards cut there: done."""
    reached = set()
    for shard, groups in window.shards.items():
        bound = bounds.get(shard)
        if bound is None:
            continue
        for index, group in enumerate(groups):
            if group.row_ids[0] > bound:
                del groups[index:]
                reached.add(shard)
                break
    return reached


def done_shards(
    active: Sequence[ShardKey], window: Window, reached: set[ShardKey], failed: set[ShardKey]
) -> list[ShardKey]:
    """The shards a round finished: read to their end (or to a flush's bound) and not
    failed; release them."""
    return [
        key
        for key in active
        if (key not in window.incomplete or key in reached) and key not in failed
    ]


@dataclass(frozen=True)
class StopRequest:
    """A stop request as the waiting thread saw it."""

    signum: int | None  # None: `request_stop()` / `stop_all()` without a signal
    forced: bool  # a second request: stop waiting for the receiver in flight
    elapsed: float  # seconds since the first request


@dataclass
class DrainOutcome:
    """What a run did; `abandoned` when it stopped waiting for a running receiver."""

    stats: DrainStats = field(default_factory=DrainStats)
    abandoned: bool = False
    stop: StopRequest | None = None  # the latest stop request, if any


# --- A backlog's pipeline -----------------------------------------------------------


class JobThread:
    """Runs one job at a time, in the order given, each in its caller's context."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, job: Callable[[], _T]) -> Future[_T]:
        """Run `job` on the thread, in the caller's context (tracing spans, say)."""
        future: Future[_T] = Future()
        context = contextvars.copy_context()
        self._jobs.put((lambda: context.run(job), future))
        return future

    def stop(self) -> None:
        """End the thread once the jobs given are done, and wait for it."""
        self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        try:
            while (item := self._jobs.get()) is not None:
                job, future = item
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            connections.close_all()  # this thread's own connections


@dataclass
class Claimed:
    """A batch claimed: its lease and, if claimed ahead, the keeper's holding of it
    (None: not claimed ahead, or no shard won)."""

    lease: Lease
    holding: Holding | None = None
    window: Window | None = None  # its first window, where it was read with the claim


class ClaimAhead:
    """Claims one drain's next batches on a background thread, one claim at a time."""

    def __init__(self, backend: OutboxBackend, model: type[OutboxBase]) -> None:
        self.backend = backend
        self.model = model
        self._thread: JobThread | None = None
        self._next: deque[Future[Claimed]] = deque()

    @property
    def started(self) -> int:
        """How many claims are under way or done and not taken."""
        return len(self._next)

    def start(self, claim: Callable[[], Lease]) -> None:
        """Claim with `claim`, on the thread, once the claims started before are done."""
        if self._thread is None:
            self._thread = JobThread("outbox-claim")
        self._next.append(self._thread.run(lambda: self._claim(claim)))

    def take(self) -> Claimed:
        """The batch claimed first of those not taken; raises what its claim raised."""
        return self._next.popleft().result()

    def cancel(self) -> None:
        """Let go of the batches claimed ahead and not taken (the drain claims anew)."""
        while self._next:
            try:
                claimed = self.take()
            except Exception:
                continue  # that claim failed: nothing to let go
            self.release(claimed)

    def close(self) -> None:
        """`cancel`, then end the thread."""
        thread, self._thread = self._thread, None
        try:
            self.cancel()
        finally:
            if thread is not None:
                thread.stop()

    def release(self, claimed: Claimed) -> None:
        """Stop renewing a claimed batch (if claimed ahead) and release its shards."""
        if claimed.holding is not None:
            LeaseKeeper.get().drop(claimed.holding)
        if claimed.lease.shards:
            release_quietly(self.backend, self.model, claimed.lease)

    def _claim(self, claim: Callable[[], Lease]) -> Claimed:
        lease = claim()
        if not lease.shards:
            return Claimed(lease)
        holding = Holding(self.backend, self.model, lease)
        LeaseKeeper.get().hold(holding)
        return Claimed(lease, holding)


@dataclass
class Unsettled:
    """A batch's last round, delivered and not settled yet: already counted into the
    drain's statistics as if its settle deleted `expected` rows; its lease is still
    renewed (`holding`) and still lists the shards being settled."""

    lease: Lease
    round: Round
    settlement: Settlement
    expected: int
    holding: Holding


def settle_round(
    backend: OutboxBackend,
    model: type[OutboxBase],
    using: str,
    lease: Lease,
    round_: Round,
    done: Sequence[ShardKey],
) -> SettleResult:
    """Settle a delivered round under `lease` in the calling thread, `done` its shards
    to release: the one settle of the engine (a drain's own, a straggler's, and, on its
    thread, `SettleBehind`'s through `apply_settlement`). The shards it found lost are
    added to the round and announced."""
    settled = apply_settlement(backend, model, lease, round_.settlement(list(done)))
    round_.lost.update(settled.lost)
    report_leases_lost(model, round_.lost, using)
    return settled


def apply_settlement(
    backend: OutboxBackend, model: type[OutboxBase], lease: Lease, settlement: Settlement
) -> SettleResult:
    """`backend.settle`, retried on a transient lock error."""
    return retrying(backend, lambda: backend.settle(model, lease, settlement))


class SettleBehind:
    """Settles one drain's batches on a background thread, one at a time."""

    def __init__(self, backend: OutboxBackend, model: type[OutboxBase], using: str) -> None:
        self.backend = backend
        self.model = model
        self.using = using
        self._thread: JobThread | None = None
        self._in_flight: tuple[Unsettled, Future[SettleResult]] | None = None

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def submit(self, pending: Unsettled, stats: DrainStats) -> None:
        """Settle `pending` in the background, once the settle in flight is done (and
        counted into `stats`; if it failed, this raises and `pending` is not taken)."""
        self.wait(stats)
        if self._thread is None:
            self._thread = JobThread("outbox-settle")
        self._in_flight = (pending, self._thread.run(lambda: self._settle(pending)))

    def settle_now(self, pending: Unsettled, stats: DrainStats) -> None:
        """Settle `pending` in this thread, after the settle in flight (if any)."""
        try:
            self.wait(stats)
        finally:
            self._count(pending, self._settle(pending), stats)

    def wait(self, stats: DrainStats) -> None:
        """Wait for the settle in flight, if any, and count it into `stats`; raises
        what the settle raised."""
        if self._in_flight is not None:
            pending, future = self._in_flight
            self._in_flight = None
            self._count(pending, future.result(), stats)

    def catch_up(self, stats: DrainStats, pending: Unsettled | None = None) -> None:
        """Settle `pending` now, after the settle in flight: every batch delivered so
        far is then settled and its shards released."""
        if pending is not None:
            self.settle_now(pending, stats)
        else:
            self.wait(stats)

    def close(self, stats: DrainStats, pending: Unsettled | None = None) -> None:
        """`catch_up`, then end the thread and close its connection."""
        thread, self._thread = self._thread, None
        try:
            self.catch_up(stats, pending)
        finally:
            if thread is not None:
                thread.stop()

    def abandon(self, pending: Unsettled | None) -> None:
        """`close` while an error propagates: whatever fails here is logged, not raised."""
        try:
            self.close(DrainStats(), pending)
        except Exception:
            logger.warning("outbox could not settle a batch after an error", exc_info=True)

    def _settle(self, pending: Unsettled) -> SettleResult:
        """Settle the batch, then let its lease go: the keeper renews it until here. A
        settle that fails releases the shards, as a failed settle in the drain's own
        thread leaves them, before the error reaches the drain."""
        try:
            return apply_settlement(self.backend, self.model, pending.lease, pending.settlement)
        except BaseException:
            release_quietly(self.backend, self.model, pending.lease)
            raise
        finally:
            LeaseKeeper.get().drop(pending.holding)

    def _count(self, pending: Unsettled, settled: SettleResult, stats: DrainStats) -> None:
        """Correct `stats` by what the settle did (it was counted as `expected`)."""
        lost = pending.round.lost
        lost_before = len(lost)
        lost.update(settled.lost)
        report_leases_lost(self.model, lost, self.using)
        stats.rows_retired += settled.deleted - pending.expected
        stats.leases_lost += len(lost) - lost_before
