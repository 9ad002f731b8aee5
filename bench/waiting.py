"""Receivers that wait: how the drain's concurrency turns receivers that wait on the
network (here: a sleep) into throughput, on PostgreSQL.

Each shape (`bench.waiting_runs.Plan`; the shapes of each mode, their sizes and goals
in `bench.waiting_plans`) is loaded, then drained by one-shot
`drain_outboxes(concurrency=N)` calls in fresh worker processes released together
(`bench.workers`), timed from the first drain's start to the last one's end. Every
message is its own object (nothing coalesces), so every message is one call, and the
receivers (`bench.waiting_receivers`) record each call: lost and duplicate deliveries
are counted per (shard, object), and each shard's calls, ordered by start, must come in
the shard's order. The ideal rate keeps every slot busy all the time:
min(shards, concurrency x processes) / wait.

- sync 10 ms at concurrency 32, at the default concurrency and at concurrency 1;
- the concurrency-1 and the default-concurrency shapes in 4 processes at once (one-shot
  drains), each against 1 process;
- an `async def` receiver awaiting a 50 ms sleep, one message per shard, concurrency 200;
- 20 messages per shard (order kept across the slots), concurrency 32;
- one call hung among the shards (concurrency 8): when every other shard was delivered
  (its last call returned) and settled (its rows deleted, polled every 10 ms), from the
  drain's start; its OUTBOX_RECEIVER_TIMEOUT_SECONDS is set so the drain gives the hung
  call up instead of waiting it out;
- procrastinate's worker at `concurrency` 32 on the same messages as jobs of a sync task
  that sleeps 10 ms (`bench.tasks.wait`);
- what the slots cost receivers that return at once: no-op drains at the default
  concurrency against 1, side by side (`bench.slots_cost`);
- what the bound on unsettled work costs, side by side (`bench.unsettled_cost`).

Goals are reported, met or missed ("missed_goals"), and never fail the run; a lost,
duplicate or out-of-order call fails it in any mode.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable
from typing import Any

from bench import waiting_report
from bench.slots_cost import measure as measure_slots_cost
from bench.unsettled_cost import measure as measure_unsettled_cost
from bench.waiting_plans import HUNG_GOAL_S, MODES, PROCESS_GOAL, PROCRASTINATE_GOAL, plans
from bench.waiting_runs import Plan, SettleWatch, left, load, tally

TITLE = "Receivers that wait (concurrency, async receivers, a hung call)"
markdown = waiting_report.markdown


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The section (see the module docstring). A harness failure is reported as a problem
    of a skipped section, so the other sections' results are still written."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {"skipped": "the section runs on PostgreSQL"}
    try:
        return _measure(mode, log)
    except Exception as exc:
        log("waiting failed:\n" + traceback.format_exc())
        return {"skipped": f"failed: {exc}", "problems": [f"waiting: failed: {exc}"]}


def _measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    from bench.db import reset

    load_start = list(os.getloadavg())
    rounds, budget = MODES[mode].rounds, MODES[mode].budget_s
    skipped = _procrastinate_missing()
    selected = [plan for plan in plans(mode) if not (plan.procrastinate and skipped)]
    runs: dict[str, list[dict[str, Any]]] = {plan.name: [] for plan in selected}
    problems: list[str] = []
    for round_ in range(rounds):
        for plan in selected:
            if plan.hang_s and round_:
                continue  # timed by its goal, not a rate: once is enough
            result = _run(plan, budget)
            runs[plan.name].append(result)
            problems += result.pop("problems")
            log(waiting_report.progress(plan, result))
    slots_cost, unsettled_cost = measure_slots_cost(mode), measure_unsettled_cost(mode)
    log(
        f"waiting: no-op slots cost {[round(s['ratio'] or 0, 2) for s in slots_cost['shapes']]}, "
        f"bound cost {[round(s['ratio'] or 0, 2) for s in unsettled_cost['shapes']]}"
    )
    reset()
    shapes = {name: _median(results) for name, results in runs.items()}
    comparisons = waiting_report.comparisons(shapes, PROCESS_GOAL, PROCRASTINATE_GOAL)
    return {
        "shapes": shapes,
        "comparisons": comparisons,
        "procrastinate_skipped": skipped,
        "procrastinate_threads": min(32, (os.cpu_count() or 1) + 4),
        "rounds": rounds,
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "slots_cost": slots_cost,
        "unsettled_cost": unsettled_cost,
        "problems": problems,
        "missed_goals": _missed(shapes, comparisons),
    }


def _missed(shapes: dict[str, Any], comparisons: list[dict[str, Any]]) -> list[str]:
    """The goals this run missed, in words."""
    missed = [
        f"waiting: {shape['title']}: goal {shape['goal_text']} missed"
        for shape in shapes.values()
        if shape["met"] is False
    ]
    missed += [
        f"waiting: {c['what']} = {c['value']:.2f}, goal {c['goal']}"
        for c in comparisons
        if c["met"] is False
    ]
    return missed


def _procrastinate_missing() -> str | None:
    from django.conf import settings

    if not getattr(settings, "HAS_PROCRASTINATE", False):
        return "procrastinate is not installed (pip install -e '.[bench]')"
    return None


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median rate, with every run's rate in `runs_per_s`."""
    ranked = sorted(results, key=lambda result: result["per_s"])
    return {**ranked[(len(ranked) - 1) // 2], "runs_per_s": [r["per_s"] for r in results]}


def _run(plan: Plan, budget: float) -> dict[str, Any]:
    """Load the plan's messages, drain them in its processes, and describe the run."""
    from bench.workers import run_processes

    loaded = load(plan)
    if plan.procrastinate:
        target, kwargs = "bench.waiting_runs.procrastinate", {"concurrency": plan.concurrency}
    else:
        # The default concurrency is the drain's own: it is given none.
        concurrency = None if plan.default_concurrency else plan.concurrency
        kwargs = {"concurrency": concurrency, "timeout": plan.timeout_s}
        target = "bench.waiting_runs.drain"
    watch = SettleWatch() if plan.hang_s else None
    with watch or contextlib.nullcontext():
        run = run_processes(target, plan.processes, budget, **kwargs)
    started = min(result["drain_started"] for result in run.results)
    seconds = max(result["drain_finished"] for result in run.results) - started
    records = [record for result in run.results for record in result["records"]]
    rows_left = left(plan)
    result: dict[str, Any] = {
        **plan.describe(),
        "loaded": loaded,
        "retired": loaded - rows_left,
        "left": rows_left,
        "seconds": seconds,
        "failures": sum(int(r.get("failures", 0)) for r in run.results),
        "complete": all(r["complete"] for r in run.results),
        **tally(plan, records, started),
    }
    if plan.processes > 1:
        result["per_process"] = [
            {"calls": len(r["records"]), "ended_s": r["drain_finished"] - started}
            for r in run.results
        ]
    if watch is not None:
        result["settled_s"] = watch.settled_at - started if watch.settled_at else None
        result["receiver_timeout_s"] = plan.timeout_s
        result["hang_s"] = plan.hang_s
    waiting_report.rate(plan, result, HUNG_GOAL_S)
    result["problems"] = _check(plan, result)
    return result


def _check(plan: Plan, result: dict[str, Any]) -> list[str]:
    """What went wrong with a run's deliveries (goals aside)."""
    label = f"waiting/{plan.name}"
    problems = [
        f"{label}: {result[key]} {what}"
        for key, what in (
            ("lost", "messages never delivered"),
            ("duplicates", "duplicate calls"),
            ("unexpected", "calls of messages not owed"),
        )
        if result[key]
    ]
    if not plan.procrastinate:  # its jobs keep no order without a lock
        for key, what in (
            ("out_of_order_shards", "out of order"),
            ("overlapping_shards", "with calls overlapping"),
        ):
            if result[key]:
                problems.append(f"{label}: {result[key]} shards delivered {what}")
    expected_left, expected_failures = (plan.per_shard, 1) if plan.hang_s else (0, 0)
    if result["left"] != expected_left:
        problems.append(f"{label}: {result['left']} messages left, expected {expected_left}")
    if result["failures"] != expected_failures:
        problems.append(f"{label}: {result['failures']} failures, expected {expected_failures}")
    if plan.hang_s and result.get("hung_calls") != 1:
        problems.append(f"{label}: the hung message was called {result.get('hung_calls')} times")
    return problems
