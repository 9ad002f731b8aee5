"""How big each mode is. `full` is the published run (~15-20 minutes on 2 cores)."""

from __future__ import annotations

from dataclasses import dataclass

from bench import shapes
from bench.shapes import Shape


@dataclass(frozen=True)
class Sizes:
    one_per_shard_rows: int
    one_per_shard_small_rows: int  # a second, smaller one-message-per-shard backlog
    streams: tuple[int, int]  # shards, distinct objects per shard
    coalescing: tuple[int, int]  # objects (each its own shard), updates per object
    scale_rows: tuple[int, ...]  # backlogs of the scale test (ordered streams, 100/shard)
    write_iterations: int  # per variant
    write_block: int
    sync_iterations: int
    drain_budget: float  # seconds a contender may drain one shape
    scale_budget: float  # seconds the engine may drain one scale backlog

    @property
    def small_label(self) -> str:
        rows = self.one_per_shard_small_rows
        return f"{rows // 1000}k" if rows >= 1000 and rows % 1000 == 0 else str(rows)

    def shapes(self) -> list[Shape]:
        return [
            shapes.ordered_streams(*self.streams),
            shapes.heavy_coalescing(*self.coalescing),
            shapes.audit_log(self.one_per_shard_small_rows, f"_{self.small_label}"),
            shapes.audit_log(self.one_per_shard_rows),
        ]


MODES: dict[str, Sizes] = {
    "smoke": Sizes(100, 50, (10, 10), (10, 10), (500, 1_000, 2_000), 200, 20, 50, 60.0, 60.0),
    "quick": Sizes(
        10_000, 2_000, (100, 100), (100, 100), (10_000, 100_000), 1_000, 50, 200, 30.0, 120.0
    ),
    "full": Sizes(
        100_000,
        20_000,
        (1_000, 100),
        (1_000, 100),
        (10_000, 100_000, 1_000_000),
        3_000,
        50,
        500,
        60.0,
        480.0,
    ),
}

SCALE_OBJECTS_PER_SHARD = 100


def scale_shape(rows: int) -> Shape:
    """The scale test's backlog: ordered streams of 100 objects per shard."""
    return shapes.ordered_streams(max(rows // SCALE_OBJECTS_PER_SHARD, 1), SCALE_OBJECTS_PER_SHARD)
