"""Figures and Markdown of the "Receivers that wait" section (`bench.waiting`)."""

from __future__ import annotations

from typing import Any

from bench import slots_cost, unsettled_cost
from bench.waiting_runs import Plan


def rate(plan: Plan, result: dict[str, Any], hung_goal_s: float) -> None:
    """Add the run's rate, its ratio to the ideal, the goal and whether it was met.

    The hung shape is judged by when the other shards were done, not by a rate: its
    drain waits for the hung call until the receiver timeout gives it up. Its rate is
    the other shards' messages over the time they took to be settled."""
    if plan.hang_s:
        settled, returned = result["settled_s"], result["last_other_return_s"]
        result["per_s"] = result["retired"] / settled if settled else 0.0
        result["ratio"] = None
        result["goal_text"] = f"others settled ≤ {hung_goal_s:.1f} s"
        result["met"] = (
            settled is not None and returned is not None and max(settled, returned) <= hung_goal_s
        )
        return
    seconds = result["seconds"]
    result["per_s"] = result["retired"] / seconds if seconds > 0 else 0.0
    result["ratio"] = result["per_s"] / plan.ideal_per_s
    result["goal_text"] = f"≥ {plan.goal:.1f} x ideal" if plan.goal else "-"
    result["met"] = result["ratio"] >= plan.goal if plan.goal else None


def comparisons(
    shapes: dict[str, Any], process_goal: float, procrastinate_goal: float
) -> list[dict[str, Any]]:
    """The shapes side by side: processes, concurrency, procrastinate."""
    found = []
    for single, several, which in (
        ("sync_c1", "sync_c1_processes", "concurrency 1"),
        ("sync_default", "sync_default_processes", "default concurrency"),
    ):
        one, many = shapes.get(single), shapes.get(several)
        if one and many and one["per_s"]:
            found.append(
                _compare(
                    f"{many['processes']} processes ÷ 1 process ({which})",
                    many["per_s"] / one["per_s"],
                    process_goal * many["processes"],
                )
            )
    one = shapes.get("sync_c1")
    for name in ("sync_c32", "sync_default"):
        shape = shapes.get(name)
        if shape and one and one["per_s"]:
            found.append(
                _compare(
                    f"concurrency {shape['concurrency']} ÷ concurrency 1 (1 process)",
                    shape["per_s"] / one["per_s"],
                    None,
                )
            )
    ours, theirs = shapes.get("sync_c32"), shapes.get("procrastinate_c32")
    if ours and theirs and theirs["per_s"]:
        found.append(
            _compare(
                "ours at concurrency 32 ÷ procrastinate's worker at concurrency 32",
                ours["per_s"] / theirs["per_s"],
                procrastinate_goal,
            )
        )
    return found


def _compare(what: str, value: float, goal: float | None) -> dict[str, Any]:
    return {
        "what": what,
        "value": value,
        "goal": f"≥ {goal:.1f}" if goal else "-",
        "met": value >= goal if goal else None,
    }


def progress(plan: Plan, result: dict[str, Any]) -> str:
    """One log line per run."""
    line = (
        f"waiting {plan.name:<18} {result['retired']:>5,} msgs in {result['seconds']:6.2f}s"
        f" = {result['per_s']:>7,.0f}/s"
    )
    if result["ratio"] is not None:
        line += f", {result['ratio']:.2f} x ideal {plan.ideal_per_s:,.0f}/s"
    if plan.hang_s:
        line += (
            f", others returned by {_seconds(result['last_other_return_s'])}"
            f", settled by {_seconds(result['settled_s'])}"
        )
    if "per_process" in result:
        line += f" (calls per process {_split(result)})"
    return line + (
        f"; lost {result['lost']}, duplicates {result['duplicates']}, "
        f"shards out of order {result['out_of_order_shards']}, "
        f"overlapping {result['overlapping_shards']}"
    )


def _split(result: dict[str, Any]) -> str:
    """Calls and end time of each process, e.g. `520 by 5.31 s / 160 by 1.65 s`."""
    return " / ".join(
        f"{process['calls']:,} by {process['ended_s']:.2f} s" for process in result["per_process"]
    )


def _seconds(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "never"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[met]


def _order(shape: dict[str, Any]) -> str:
    """`kept`: each shard's calls in its order, one at a time; procrastinate keeps none."""
    if shape["title"].startswith("procrastinate"):
        return "n/a"
    wrong = [
        f"**{shape[key]} shards {what}**"
        for key, what in (("out_of_order_shards", "out"), ("overlapping_shards", "overlap"))
        if shape[key]
    ]
    return ", ".join(wrong) or "kept"


def _shape_row(shape: dict[str, Any]) -> str:
    ratio, ideal = shape["ratio"], shape["ideal_per_s"]
    order = _order(shape)
    seconds = shape["settled_s"] if "settled_s" in shape else shape["seconds"]
    return (
        f"| {shape['title']} | {shape['retired']:,} | {_seconds(seconds)} "
        f"| {shape['per_s']:,.0f} | {f'{ideal:,.0f}' if ratio is not None else '-'} "
        f"| {f'**{ratio:.2f}**' if ratio is not None else '-'} | {shape['goal_text']} "
        f"| {_met(shape['met'])} | {shape['lost']} / {shape['duplicates']} | {order} |"
    )


def markdown(result: dict[str, Any]) -> list[str]:
    start, end = result["load_average_start"][0], result["load_average_end"][0]
    lines = [
        "PostgreSQL. Each shape is drained by one-shot `drain_outboxes(concurrency=N)` "
        "calls in fresh worker processes released together, timed from the first drain's "
        "start to the last one's end; every message is its own object (one call each). "
        "Ideal: every slot busy all the time, min(shards, concurrency x processes) / "
        "wait. Lost / dup: messages never delivered / extra calls, counted per (shard, "
        "object) in the receiver; order: each shard's calls, ordered by start, in the "
        "shard's order and none starting before the one before it returned. Load "
        f"average {start:.2f} at the start, {end:.2f} at the end"
        + (f"; median of {result['rounds']} rounds." if result["rounds"] > 1 else "."),
        "",
        "| shape | messages | seconds | msg/s | ideal msg/s | ÷ ideal | goal | met "
        "| lost / dup | order |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_shape_row(shape) for shape in result["shapes"].values()),
        "",
        "| comparison | ratio | goal | met |",
        "|---|---|---|---|",
        *(
            f"| {c['what']} | **{c['value']:.2f}** | {c['goal']} | {_met(c['met'])} |"
            for c in result["comparisons"]
        ),
    ]
    for shape in result["shapes"].values():
        if "per_process" in shape:
            lines += ["", _processes_line(shape)]
    hung = next((s for s in result["shapes"].values() if "hang_s" in s), None)
    if hung:
        lines += ["", _hung_line(hung)]
    lines += ["", _procrastinate_line(result)]
    if "slots_cost" in result:
        lines += ["", *slots_cost.markdown(result["slots_cost"])]
    if "unsettled_cost" in result:
        lines += ["", *unsettled_cost.markdown(result["unsettled_cost"])]
    return lines


def _processes_line(shape: dict[str, Any]) -> str:
    return (
        f"{shape['processes']} one-shot drains at once: calls and end (from the first "
        f"drain's start) of each, {_split(shape)}. A one-shot drain ends at its first "
        "claim that wins no shard; claims made at the same moment pick the same free "
        "shards and the losers of that race win none, so a drain can end while shards "
        "are still due, leaving them to the others."
    )


def _hung_line(hung: dict[str, Any]) -> str:
    return (
        f"Hung call: the first message of one shard waits {hung['hang_s']:.0f} s; "
        f"`OUTBOX_RECEIVER_TIMEOUT_SECONDS` = {hung['receiver_timeout_s']:.0f} for this "
        "shape, so the drain gives that call up (a failed attempt, its shard rescheduled) "
        "instead of waiting it out. From the drain's start, the last call of every other "
        f"shard returned after {_seconds(hung['last_other_return_s'])} and their rows were "
        f"all deleted (settled) after {_seconds(hung['settled_s'])}; the drain ended after "
        f"{hung['seconds']:.2f} s; the hung message was called {hung['hung_calls']} time(s) "
        f"and {hung['left']} message(s) of its shard are left for a retry."
    )


def _procrastinate_line(result: dict[str, Any]) -> str:
    if result["procrastinate_skipped"]:
        return f"procrastinate skipped: {result['procrastinate_skipped']}."
    return (
        "procrastinate runs a sync task through `asgiref`'s `sync_to_async` in the event "
        "loop's default thread pool, min(32, CPUs + 4) = "
        f"{result['procrastinate_threads']} threads on this machine, whatever the worker's "
        "`concurrency`; its docs advise against concurrency with blocking sync tasks. It "
        "keeps no order without a lock, so its order is not checked."
    )
