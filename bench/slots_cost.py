"""What delivering on slot threads costs receivers that return at once.

The same no-op drains (`drain_outboxes()` in this process until the table is empty, the
bench's counting receiver) at the default `OUTBOX_CONCURRENCY` and at concurrency 1,
alternating which goes first round by round, so both see the same machine. Reported
as seconds per drain (median) and their ratio: 1.00 means the slots cost nothing.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

# (one message per shard rows, ordered streams (shards, objects each), rounds)
MODES = {
    "smoke": (2_000, (20, 100), 1),
    "quick": (50_000, (100, 500), 3),
    "full": (100_000, (100, 1_000), 5),
}


def measure(mode: str) -> dict[str, Any]:
    from bench import shapes
    from outbox.conf import outbox_settings

    one_per_shard, (shards, objects), rounds = MODES[mode]
    concurrency = outbox_settings.CONCURRENCY
    results = [
        _side_by_side(shape, concurrency, rounds)
        for shape in (shapes.audit_log(one_per_shard), shapes.ordered_streams(shards, objects))
    ]
    return {"concurrency": concurrency, "rounds": rounds, "shapes": results}


def _side_by_side(shape: Any, concurrency: int, rounds: int) -> dict[str, Any]:
    seconds: dict[int, list[float]] = {1: [], concurrency: []}
    for setting in seconds:  # warm up, unmeasured: connections, statements, caches
        _drain(shape, setting)
    for round_ in range(rounds):
        order = (1, concurrency) if round_ % 2 == 0 else (concurrency, 1)
        for setting in order:
            seconds[setting].append(_drain(shape, setting))
    one, many = statistics.median(seconds[1]), statistics.median(seconds[concurrency])
    return {
        "title": f"{shape.title}, {shape.rows:,} rows",
        "rows": shape.rows,
        "concurrency_1_s": one,
        "concurrency_n_s": many,
        "runs_1_s": seconds[1],
        "runs_n_s": seconds[concurrency],
        "ratio": many / one if one else None,
    }


def _drain(shape: Any, concurrency: int) -> float:
    from django.test import override_settings

    from bench.db import load_shape, outbox_rows, reset
    from outbox.engine import drain_outboxes

    reset()
    load_shape(shape)
    with override_settings(OUTBOX_CONCURRENCY=concurrency):
        started = time.perf_counter()
        while outbox_rows():
            drain_outboxes()
        return time.perf_counter() - started


def markdown(result: dict[str, Any]) -> list[str]:
    n = result["concurrency"]
    lines = [
        f"No-op receivers, concurrency {n} (the default) against 1, side by side: "
        "`drain_outboxes()` in this process until the table is empty, alternating which "
        f"goes first; seconds per drain, median of {result['rounds']}.",
        "",
        f"| shape | concurrency 1 (s) | concurrency {n} (s) | {n} ÷ 1 |",
        "|---|---|---|---|",
    ]
    for shape in result["shapes"]:
        ratio = f"{shape['ratio']:.2f}" if shape["ratio"] is not None else "-"
        lines.append(
            f"| {shape['title']} | {shape['concurrency_1_s']:.3f} "
            f"| {shape['concurrency_n_s']:.3f} | **{ratio}** |"
        )
    return lines
