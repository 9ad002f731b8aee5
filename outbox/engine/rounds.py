"""What a drain did (`DrainStats`: summaries, logs, tests), what one window's delivery
did (`Round`, settled as one statement), and which shards a round is done with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from outbox.backends.base import FailedGroup, Settlement, Window
from outbox.shards import ShardKey


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
