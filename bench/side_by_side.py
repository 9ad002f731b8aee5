"""Two values of one setting side by side on the same drains (`bench.slots_cost`,
`bench.unsettled_cost`).

Each value's drain runs once unmeasured (connections, statements, caches), then once a
round, alternating which goes first round by round so both see the same machine.
Reported as seconds per drain (median of the rounds) and their ratio, the measured
value's over the reference's: 1.00 means the measured value costs nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Side:
    """One value of the setting, with its keys in the result and its table column."""

    value: Any
    median_key: str  # the median of its rounds, in seconds
    runs_key: str  # every round's seconds
    label: str  # the heading of its column


def compare(
    title: str,
    drain: Callable[[], float],
    setting: str,
    reference: Side,
    measured: Side,
    rounds: int,
) -> dict[str, Any]:
    """Time `drain` (it returns its seconds) with the Django `setting` at either side's
    value: one unmeasured drain each, then `rounds` rounds, the reference first in even
    rounds and the measured value first in odd ones."""
    sides = (reference, measured)
    seconds: tuple[list[float], list[float]] = ([], [])
    for side in sides:  # warm up, unmeasured
        _drain_with(drain, setting, side.value)
    for round_ in range(rounds):
        for index in (0, 1) if round_ % 2 == 0 else (1, 0):
            seconds[index].append(_drain_with(drain, setting, sides[index].value))
    base, cost = statistics.median(seconds[0]), statistics.median(seconds[1])
    return {
        "title": title,
        reference.median_key: base,
        measured.median_key: cost,
        reference.runs_key: seconds[0],
        measured.runs_key: seconds[1],
        "ratio": cost / base if base else None,
    }


def _drain_with(drain: Callable[[], float], setting: str, value: Any) -> float:
    from django.test import override_settings

    with override_settings(**{setting: value}):
        return drain()


def no_op_drain(shape: Any) -> Callable[[], float]:
    """A drain of `shape` (a `bench.shapes.Shape`, the bench's counting receiver):
    `drain_outboxes()` in this process until the table is empty, loading untimed."""

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


def markdown(
    what: str, result: dict[str, Any], reference: Side, measured: Side, ratio_label: str
) -> list[str]:
    """The sentence that says `what` is compared and how, then the table: a row per
    shape of `result["shapes"]`, the reference's column first."""
    lines = [
        f"{what}, side by side: `drain_outboxes()` in this process until the table is "
        "empty, alternating which goes first; seconds per drain, median of "
        f"{result['rounds']}.",
        "",
        f"| shape | {reference.label} | {measured.label} | {ratio_label} |",
        "|---|---|---|---|",
    ]
    for shape in result["shapes"]:
        ratio = f"{shape['ratio']:.2f}" if shape["ratio"] is not None else "-"
        lines.append(
            f"| {shape['title']} | {shape[reference.median_key]:.3f} "
            f"| {shape[measured.median_key]:.3f} | **{ratio}** |"
        )
    return lines
