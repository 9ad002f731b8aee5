"""What delivering on slot threads costs receivers that return at once.

The same no-op drains (`drain_outboxes()` in this process until the table is empty, the
bench's counting receiver) at the default `OUTBOX_CONCURRENCY` and at concurrency 1,
side by side (`bench.side_by_side`: alternating which goes first round by round, so
both see the same machine). Reported as seconds per drain (median) and their ratio:
1.00 means the slots cost nothing.
"""

from __future__ import annotations

from typing import Any

from bench import side_by_side
from bench.side_by_side import Side

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
    one, many = _sides(concurrency)
    results = [
        {
            **side_by_side.compare(
                f"{shape.title}, {shape.rows:,} rows",
                side_by_side.no_op_drain(shape),
                "OUTBOX_CONCURRENCY",
                one,
                many,
                rounds,
            ),
            "rows": shape.rows,
        }
        for shape in (shapes.audit_log(one_per_shard), shapes.ordered_streams(shards, objects))
    ]
    return {"concurrency": concurrency, "rounds": rounds, "shapes": results}


def _sides(concurrency: int) -> tuple[Side, Side]:
    """Concurrency 1, the reference, and the default."""
    return (
        Side(1, "concurrency_1_s", "runs_1_s", "concurrency 1 (s)"),
        Side(concurrency, "concurrency_n_s", "runs_n_s", f"concurrency {concurrency} (s)"),
    )


def markdown(result: dict[str, Any]) -> list[str]:
    n = result["concurrency"]
    return side_by_side.markdown(
        f"No-op receivers, concurrency {n} (the default) against 1", result, *_sides(n), f"{n} ÷ 1"
    )
