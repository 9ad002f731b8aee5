"""What the bound on unsettled work (`OUTBOX_UNSETTLED_SECONDS`) costs in throughput.

The same drains (`drain_outboxes()` in this process until the table is empty) at the
default bound and at `LOOSE_SECONDS`, which leaves the batches of receivers that wait
about as long as before the bound existed (a second each), alternating which goes first
round by round so both see the same machine. Two shapes whose receivers wait (sync
10 ms at concurrency 32: one shard after another, and 20 messages per shard), whose
claims the bound shortens, and the two no-op shapes of `bench.slots_cost`,
which it should leave alone. Reported as seconds per drain (median) and their ratio:
1.00 means the bound costs nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

LOOSE_SECONDS = 2.0
WAITING_PLANS = ("sync_c32", "ordered_c32")
ROUNDS = {"smoke": 1, "quick": 3, "full": 5}


def measure(mode: str) -> dict[str, Any]:
    from bench import shapes, slots_cost, waiting
    from outbox.conf import outbox_settings

    default = outbox_settings.UNSETTLED_SECONDS
    rounds = ROUNDS[mode]
    waiting_plans = [plan for plan in waiting.plans(mode) if plan.name in WAITING_PLANS]
    one_per_shard, (shards, objects), _ = slots_cost.MODES[mode]
    no_op = (shapes.audit_log(one_per_shard), shapes.ordered_streams(shards, objects))
    runs = [
        *(
            _side_by_side(plan.title, _waiting_drain(plan), default, rounds)
            for plan in waiting_plans
        ),
        *(
            _side_by_side(
                f"{shape.title}, {shape.rows:,} rows, no-op", _no_op_drain(shape), default, rounds
            )
            for shape in no_op
        ),
    ]
    return {"default_s": default, "loose_s": LOOSE_SECONDS, "rounds": rounds, "shapes": runs}


def _side_by_side(
    title: str, drain: Callable[[], float], default: float, rounds: int
) -> dict[str, Any]:
    from django.test import override_settings

    seconds: dict[float, list[float]] = {default: [], LOOSE_SECONDS: []}
    for bound in seconds:  # warm up, unmeasured
        with override_settings(OUTBOX_UNSETTLED_SECONDS=bound):
            drain()
    for round_ in range(rounds):
        order = (default, LOOSE_SECONDS) if round_ % 2 == 0 else (LOOSE_SECONDS, default)
        for bound in order:
            with override_settings(OUTBOX_UNSETTLED_SECONDS=bound):
                seconds[bound].append(drain())
    bounded, loose = statistics.median(seconds[default]), statistics.median(seconds[LOOSE_SECONDS])
    return {
        "title": title,
        "bounded_s": bounded,
        "loose_s": loose,
        "runs_bounded_s": seconds[default],
        "runs_loose_s": seconds[LOOSE_SECONDS],
        "ratio": bounded / loose if loose else None,
    }


def _waiting_drain(plan: Any) -> Callable[[], float]:
    def drain() -> float:
        from bench import waiting_receivers
        from bench.waiting_runs import left, load
        from outbox.engine import drain_outboxes
        from outbox.models import RegionOutbox

        load(plan)
        started = time.perf_counter()
        while left(plan):
            drain_outboxes([RegionOutbox], concurrency=plan.concurrency)
        elapsed = time.perf_counter() - started
        waiting_receivers.take_records()
        return elapsed

    return drain


def _no_op_drain(shape: Any) -> Callable[[], float]:
    def drain() -> float:
        from bench.db import load_shape, outbox_rows, reset
        from outbox.engine import drain_outboxes

        reset()
        load_shape(shape)
        started = time.perf_counter()
        while outbox_rows():
            drain_outboxes()
        return time.perf_counter() - started

    return drain


def markdown(result: dict[str, Any]) -> list[str]:
    default, loose = result["default_s"], result["loose_s"]
    lines = [
        f"The bound on unsettled work, `OUTBOX_UNSETTLED_SECONDS` = {default:g} (the default) "
        f"against {loose:g} (batches of receivers that wait about as long as before the "
        "bound), side by side: `drain_outboxes()` in this process until the table is "
        f"empty, alternating which goes first; seconds per drain, median of {result['rounds']}.",
        "",
        f"| shape | {loose:g} s (s) | {default:g} s (s) | bounded ÷ loose |",
        "|---|---|---|---|",
    ]
    for shape in result["shapes"]:
        ratio = f"{shape['ratio']:.2f}" if shape["ratio"] is not None else "-"
        lines.append(
            f"| {shape['title']} | {shape['loose_s']:.3f} | {shape['bounded_s']:.3f} "
            f"| **{ratio}** |"
        )
    return lines
