"""Which shapes the "Receivers that wait" section (`bench.waiting`) drains in each mode:
their sizes, the plans (`bench.waiting_runs.Plan`) in the order they run, and the goals
they are judged by. `bench.unsettled_cost` drains two of them too.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.waiting_runs import Plan

HUNG_GOAL_S = 2.0  # every other shard settled within this long of the drain's start
PROCESS_GOAL = 0.75  # N processes (concurrency 1, or the default): 0.75 x N times one
PROCRASTINATE_GOAL = 2.0  # ours at concurrency 32 over procrastinate's worker at 32


@dataclass(frozen=True)
class Sizes:
    sync: tuple[int, int]  # shards, messages per shard of the sync shapes
    async_shards: int  # one message each
    ordered_shards: int  # 20 messages each
    hung_shards: int  # 2 messages each
    hang_s: float  # how long the hung call waits
    timeout_s: float  # OUTBOX_RECEIVER_TIMEOUT_SECONDS of the hung shape's drain
    processes: int  # one-shot drains at once, against one
    rounds: int  # each shape's median of this many runs (the hung one: one run)
    budget_s: float  # seconds a drain may take


MODES = {
    "smoke": Sizes((20, 10), 200, 10, 20, 3.0, 1.0, 2, 1, 30.0),
    "quick": Sizes((200, 10), 2_000, 100, 100, 30.0, 5.0, 4, 1, 90.0),
    "full": Sizes((200, 10), 2_000, 100, 100, 30.0, 5.0, 4, 3, 90.0),
}


def plans(mode: str) -> list[Plan]:
    """Every shape of `mode`, in the order they run."""
    return [*_sync_plans(MODES[mode]), *_other_plans(MODES[mode])]


def _sync_plans(sizes: Sizes) -> list[Plan]:
    """The sync 10 ms shapes of the same messages: concurrency 32, the default (in one
    process and in several), 1 (in one and in several); procrastinate's worker at 32."""
    from outbox.conf import outbox_settings

    shards, per_shard = sizes.sync
    title = f"{shards * per_shard:,} / {shards:,} shards, sync 10 ms"
    default = outbox_settings.CONCURRENCY
    same = {"shards": shards, "per_shard": per_shard, "wait_s": 0.01}
    return [
        Plan("sync_c32", f"{title}, concurrency 32", concurrency=32, goal=0.7, **same),
        Plan(
            "sync_default",
            f"{title}, default concurrency ({default})",
            concurrency=default,
            default_concurrency=True,
            **same,
        ),
        Plan(
            "sync_default_processes",
            f"{title}, default concurrency ({default}), {sizes.processes} processes",
            concurrency=default,
            default_concurrency=True,
            processes=sizes.processes,
            **same,
        ),
        Plan("sync_c1", f"{title}, concurrency 1", concurrency=1, **same),
        Plan(
            "sync_c1_processes",
            f"{title}, concurrency 1, {sizes.processes} processes",
            concurrency=1,
            processes=sizes.processes,
            **same,
        ),
        Plan(
            "procrastinate_c32",
            f"procrastinate: {shards * per_shard:,} jobs, sync 10 ms, worker concurrency 32",
            concurrency=32,
            procrastinate=True,
            **same,
        ),
    ]


def _other_plans(sizes: Sizes) -> list[Plan]:
    """The async shape, the ordered one and the hung one."""
    shards, ordered, hung = sizes.async_shards, sizes.ordered_shards, sizes.hung_shards
    return [
        Plan(
            "async_c200",
            f"{shards:,} / {shards:,} shards, async 50 ms, concurrency 200",
            shards,
            1,
            0.05,
            200,
            asynchronous=True,
            goal=0.6,
        ),
        Plan(
            "ordered_c32",
            f"{ordered * 20:,} / {ordered} shards (20 each), sync 10 ms, concurrency 32",
            ordered,
            20,
            0.01,
            32,
            goal=0.7,
        ),
        Plan(
            "hung_c8",
            f"{hung * 2:,} / {hung} shards, sync 10 ms, one call hung {sizes.hang_s:.0f} s, "
            "concurrency 8",
            hung,
            2,
            0.01,
            8,
            hang_s=sizes.hang_s,
            timeout_s=sizes.timeout_s,
        ),
    ]
