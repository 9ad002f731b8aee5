"""What the bound on unsettled work (`OUTBOX_UNSETTLED_SECONDS`) costs in throughput.

The same drains (`drain_outboxes()` in this process until the table is empty) at the
default bound and at `LOOSE_SECONDS`, which leaves the batches of receivers that wait
about as long as before the bound existed (a second each), side by side
(`bench.side_by_side`: alternating which goes first round by round, so both see the
same machine). Two shapes whose receivers wait (sync 10 ms at concurrency 32: one shard
after another, and 20 messages per shard), whose claims the bound shortens, and the two
no-op shapes of `bench.slots_cost`, which it should leave alone. Reported as seconds per
drain (median) and their ratio: 1.00 means the bound costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import side_by_side
from bench.side_by_side import Side

LOOSE_SECONDS = 2.0
WAITING_PLANS = ("sync_c32", "ordered_c32")
ROUNDS = {"smoke": 1, "quick": 3, "full": 5}


def measure(mode: str) -> dict[str, Any]:
    from bench import shapes, slots_cost, waiting_plans
    from outbox.conf import outbox_settings

    default = outbox_settings.UNSETTLED_SECONDS
    rounds = ROUNDS[mode]
    loose, bounded = _sides(default, LOOSE_SECONDS)
    waiting = [plan for plan in waiting_plans.plans(mode) if plan.name in WAITING_PLANS]
    one_per_shard, (shards, objects), _ = slots_cost.MODES[mode]
    no_op = (shapes.audit_log(one_per_shard), shapes.ordered_streams(shards, objects))
    drains = [
        *((plan.title, _waiting_drain(plan)) for plan in waiting),
        *(
            (f"{shape.title}, {shape.rows:,} rows, no-op", side_by_side.no_op_drain(shape))
            for shape in no_op
        ),
    ]
    runs = [
        side_by_side.compare(title, drain, "OUTBOX_UNSETTLED_SECONDS", loose, bounded, rounds)
        for title, drain in drains
    ]
    return {"default_s": default, "loose_s": LOOSE_SECONDS, "rounds": rounds, "shapes": runs}


def _sides(default: float, loose: float) -> tuple[Side, Side]:
    """The loose bound, the reference, and the default one."""
    return (
        Side(loose, "loose_s", "runs_loose_s", f"{loose:g} s (s)"),
        Side(default, "bounded_s", "runs_bounded_s", f"{default:g} s (s)"),
    )


def _waiting_drain(plan: Any) -> Callable[[], float]:
    """A drain of a `bench.waiting_plans` shape: its rows loaded, then `drain_outboxes()`
    at its concurrency in this process until none is left."""

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


def markdown(result: dict[str, Any]) -> list[str]:
    default, loose = result["default_s"], result["loose_s"]
    what = (
        f"The bound on unsettled work, `OUTBOX_UNSETTLED_SECONDS` = {default:g} (the default) "
        f"against {loose:g} (batches of receivers that wait about as long as before the "
        "bound)"
    )
    return side_by_side.markdown(what, result, *_sides(default, loose), "bounded ÷ loose")
