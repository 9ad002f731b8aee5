"""What a drain or flush did, for summaries, logs and tests."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class DrainStats:
    shards: int = 0
    receiver_calls: int = 0
    groups_delivered: int = 0
    rows_retired: int = 0
    failures: int = 0
    leases_lost: int = 0
    seconds: float = 0.0
    failed_shards: list[str] = field(default_factory=list)

    @property
    def coalesced(self) -> int:
        """Rows retired without a receiver call of their own (older rows of a group)."""
        return max(self.rows_retired - self.groups_delivered, 0)

    def add(self, other: DrainStats) -> None:
        for item in fields(self):
            if item.name == "failed_shards":
                self.failed_shards.extend(other.failed_shards)
            elif item.name != "seconds":
                setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def summary(self) -> str:
        return (
            f"shards {self.shards}, receiver calls {self.receiver_calls}, "
            f"rows retired {self.rows_retired} ({self.coalesced} coalesced), "
            f"failures {self.failures}, leases lost {self.leases_lost}, "
            f"{self.seconds:.2f}s"
        )
