"""CPU per message: the drain's own CPU time per delivered message, this working tree (the
head) side by side with a baseline commit (21e7bd0, or OUTBOX_BENCH_BASELINE), in one run.

Each side is its own interpreter importing its own `outbox`, in a process of its own, on
a database of its own (`bench.cpu_sides`, `bench/cpu_driver.py`). Each writes every
shape's rows once; before each drain they are put back, untimed, and the side's process
measures its CPU time (`time.process_time()`: user and system, every thread) across
`drain_outboxes()`, divided by the calls its receiver got (nothing coalesces here: one
call per message).

- shapes: ordered streams and one message per shard (`bench.shapes`);
- concurrency 1 and the side's default (`OUTBOX_CONCURRENCY`; a side without the setting
  drains the one way it has, in both rows);
- receivers: one that counts its calls, one that copies its keyword arguments into a list.

After one unmeasured round, the sides alternate (the baseline first in even rounds, the
head in odd ones); each keeps its median µs per message, and the ratio is head ÷
baseline. In smoke mode a baseline without its virtualenv is not built: the head runs
alone, with a note saying so.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import traceback
from collections.abc import Callable
from typing import Any

from bench import cpu_sides
from bench.shapes import Shape

TITLE = "Drain CPU per message: the head against a baseline commit"

# mode: (ordered streams (shards, objects each), one-message-per-shard rows, rounds)
MODES = {
    "smoke": ((10, 20), 200, 1),
    "quick": ((200, 100), 20_000, 3),
    "full": ((1_000, 100), 100_000, 3),
}
BASELINE = os.environ.get("OUTBOX_BENCH_BASELINE", "21e7bd0")
CONCURRENCIES = (1, None)  # None: the side's default
RECEIVERS = {"count": "counts its calls", "kwargs": "copies its keyword arguments"}

Case = tuple[Shape, int | None, str]  # shape, concurrency (None: default), receiver
Runs = dict[str, list[dict[str, Any]]]  # each side's drains of one case, by side name


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The section (see the module docstring). A harness failure is reported as a problem
    of a skipped section, so the other sections' results are still written."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {"skipped": "the section runs on PostgreSQL"}
    try:
        return _measure(mode, log)
    except Exception as exc:
        log("cpu failed:\n" + traceback.format_exc())
        return {"skipped": f"failed: {exc}", "problems": [f"cpu: failed: {exc}"]}


def _measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    from bench import shapes

    load_start = list(os.getloadavg())
    (shards, objects), one_per_shard, rounds = MODES[mode]
    measured = [shapes.ordered_streams(shards, objects), shapes.audit_log(one_per_shard)]
    sides, note = _sides(mode, log)
    cases = list(itertools.product(measured, CONCURRENCIES, RECEIVERS))
    with contextlib.ExitStack() as stack:
        drivers = {side.name: stack.enter_context(cpu_sides.Driver(side)) for side in sides}
        for driver, shape in itertools.product(drivers.values(), measured):
            driver.ask(
                "write",
                shape=shape.name,
                shards=shape.shards,
                objects_per_shard=shape.objects_per_shard,
            )
        runs = _rounds(drivers, cases, rounds, log)
        described = {name: {"label": d.side.label, **d.hello} for name, d in drivers.items()}
    rows = [_row(case, runs[case]) for case in cases]
    return {
        "baseline_commit": BASELINE,
        "sides": described,
        "note": note,
        "rounds": rounds,
        "rows": rows,
        "load_average_at_start": load_start,
        "load_average_at_end": list(os.getloadavg()),
        "problems": [problem for row in rows for problem in row.pop("problems")],
    }


def _sides(mode: str, log: Callable[[str], None]) -> tuple[list[cpu_sides.Side], str | None]:
    """The baseline (unless smoke mode finds it missing) and the head, each with its
    database created afresh; and the note saying why the baseline is left out, if it is."""
    from bench.db import DEFAULT_DB, create_database

    database = os.environ.get("OUTBOX_BENCH_DB", DEFAULT_DB) + "_cpu_"
    sides, note = [cpu_sides.head(database + "head")], None
    try:
        build = mode != "smoke"
        sides.insert(0, cpu_sides.baseline(BASELINE, database + "baseline", build, log))
    except cpu_sides.Unavailable as exc:
        note = f"baseline {BASELINE} left out: {exc}"
        log(f"cpu: {note}")
    for side in sides:
        create_database(side.database)
    return sides, note


def _rounds(
    drivers: dict[str, cpu_sides.Driver],
    cases: list[Case],
    rounds: int,
    log: Callable[[str], None],
) -> dict[Case, Runs]:
    """Every case on every side, `rounds` times after one unmeasured round; the baseline
    drains first in even rounds, the head in odd ones."""
    _round(drivers, cases, reverse=True)
    runs: dict[Case, Runs] = {case: {name: [] for name in drivers} for case in cases}
    for round_ in range(rounds):
        for case, by_side in _round(drivers, cases, reverse=round_ % 2 == 1).items():
            for name, run in by_side.items():
                runs[case][name].append(run)
            figures = ", ".join(f"{name} {_us(run):.2f} µs" for name, run in by_side.items())
            log(f"cpu round {round_ + 1}, {_describe(case)}: {figures}")
    return runs


def _round(
    drivers: dict[str, cpu_sides.Driver], cases: list[Case], reverse: bool
) -> dict[Case, dict[str, dict[str, Any]]]:
    """One drain of every case by each side in turn, the same side first every time."""
    order = list(reversed(drivers)) if reverse else list(drivers)
    return {
        (shape, concurrency, receiver): {
            name: drivers[name].ask(
                "drain", shape=shape.name, receiver=receiver, concurrency=concurrency
            )
            for name in order
        }
        for shape, concurrency, receiver in cases
    }


def _describe(case: Case) -> str:
    shape, concurrency, receiver = case
    return f"{shape.name}, concurrency {concurrency or 'default'}, receiver {receiver}"


def _us(run: dict[str, Any]) -> float:
    """Microseconds of CPU per delivered message."""
    return float(run["cpu_s"]) * 1e6 / max(int(run["messages"]), 1)


def _row(case: Case, runs: Runs) -> dict[str, Any]:
    """One line of the table: each side's median and every run, their ratio, and the
    problems found (a side whose receiver did not get every message once)."""
    shape, concurrency, receiver = case
    row: dict[str, Any] = {
        "shape": shape.name,
        "title": f"{shape.title}, {shape.rows:,} rows",
        "messages": shape.rows,
        "concurrency": concurrency,
        "receiver": receiver,
        "problems": [],
    }
    for name, side_runs in runs.items():
        row[f"{name}_us"] = statistics.median(_us(run) for run in side_runs)
        row[f"{name}_runs_us"] = [_us(run) for run in side_runs]
        row[f"{name}_wall_s"] = [run["wall_s"] for run in side_runs]
        row[f"{name}_drains"] = [run["drains"] for run in side_runs]
        row[f"{name}_concurrency"] = side_runs[0]["concurrency"]
        row["problems"] += [
            f"cpu: {name}, {_describe(case)}: {run['messages']:,} calls for {shape.rows:,} messages"
            for run in side_runs
            if run["messages"] != shape.rows
        ]
    baseline, head = row.get("baseline_us"), row.get("head_us")
    row["ratio"] = head / baseline if baseline and head else None
    return row


def markdown(result: dict[str, Any]) -> list[str]:
    sides = result["sides"]
    lines = [
        "The drain process's CPU time (user + system, every thread) across "
        "`drain_outboxes()` of rows written before, per message delivered; each side in "
        "its own interpreter, importing its own `outbox`, on its own database; the sides "
        f"alternate, median of {result['rounds']} round(s) after one unmeasured. Load "
        f"{result['load_average_at_start'][0]:.1f} → {result['load_average_at_end'][0]:.1f}.",
        "",
        *[
            f"- {name}: {side['label']}, `{side['outbox_file']}`, Python {side['python']}, "
            f"Django {side['django']}, psycopg {side['psycopg']}, "
            + (
                f"default concurrency {side['default_concurrency']}"
                if side["default_concurrency"]
                else "no OUTBOX_CONCURRENCY (it drains its one way in both rows)"
            )
            for name, side in sides.items()
        ],
    ]
    if result["note"]:
        lines += ["", f"Note: {result['note']}."]
    lines += [
        "",
        "| shape | concurrency | receiver | baseline (µs/msg) | head (µs/msg) | head ÷ baseline |",
        "|---|---|---|---:|---:|---:|",
    ]
    default = sides.get("head", {}).get("default_concurrency")
    for row in result["rows"]:
        lines.append(
            f"| {row['title']} | {row['concurrency'] or f'default ({default})'} "
            f"| {RECEIVERS[row['receiver']]} | {_cell(row.get('baseline_us'))} "
            f"| {_cell(row.get('head_us'))} | {_cell(row['ratio'])} |"
        )
    return lines


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
