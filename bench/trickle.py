"""Trickle: the loop's CPU per message while writes arrive one commit at a time, this
working tree (the head) side by side with a baseline commit (ff5ddef, or
OUTBOX_BENCH_TRICKLE_BASELINE), in one run.

Each side is its own interpreter and tree (`bench.cpu_sides`: the baseline is a git
worktree beside this tree with a virtualenv of its own, the head's Django and psycopg),
on a database of its own, migrated by that tree. A run of one side at one rate
(`bench.trickle_run`): one `drain_outboxes --loop` process (`bench/trickle_drain.py`,
the side's `bench.sustained_settings` and receiver probe) and WRITERS writer processes
(`bench/trickle_writer.py`), every process importing the side's own `outbox` (checked),
the writers together committing one message per transaction at the rate (500 and 1,000 a
second), one message per shard over SHARDS shards, for the plan's time. Its window
starts `warmup_s` after the writers do and ends with them; in it:

- the write rate achieved, and the lag (commit return to receiver start) of the messages
  committed in it: p50, p99, max;
- the drain process's CPU time (utime + stime from /proc, every thread) per message
  delivered in it (receiver starts in the window);
- PostgreSQL's CPU time per message: the server processes serving the side's database
  (the drain's connections and the writers', so the writers' transactions are in it),
  the server's own processes and the autovacuum stand-in; split in the JSON;
- the statements the drain sent through psycopg per message (`bench/trickle_drain.py`).

After an unmeasured run of each side, the sides alternate, the baseline first in even
rounds, the head in odd ones; each keeps its median per rate, and the ratios are
head ÷ baseline. CPU time, not wall time: at a fixed rate the wall time is the rate's,
and the drain's CPU per message is what it costs to keep up (and what it leaves to the
rest of the machine). In smoke mode a baseline without its virtualenv is not built: the
head runs alone, with a note saying so.
"""

from __future__ import annotations

import os
import statistics
import traceback
from collections.abc import Callable
from typing import Any

from bench import cpu_sides
from bench.trickle_run import PG_PARTS, Plan

TITLE = "Trickle: the loop's CPU per message at fixed write rates, the head against a baseline"

BASELINE = os.environ.get("OUTBOX_BENCH_TRICKLE_BASELINE", "ff5ddef")
WRITERS = int(os.environ.get("OUTBOX_BENCH_TRICKLE_WRITERS", "2"))
SHARDS = 2_000
PLANS = {
    "smoke": Plan(rates=(500, 1_000), seconds=3.0, warmup_s=1.0, rounds=1),
    "quick": Plan(rates=(500, 1_000), seconds=15.0, warmup_s=2.0, rounds=2),
    "full": Plan(rates=(500, 1_000), seconds=60.0, warmup_s=5.0, rounds=3),
}
# The goals: at 500 commits a second the drain's CPU per message at most half
# the baseline's; at 1,000 a second the lag p99 at most 100 ms.
HALF_AT = 500
LAG_AT = 1_000
LAG_P99_GOAL_MS = 100.0
# Where the server's autovacuum is off, the outbox and lease tables are vacuumed this
# often during a run, as `bench.sustained` does (OUTBOX_BENCH_VACUUM_EVERY: 0 never).
VACUUM_EVERY_S = 15.0
MEDIANS = (
    *("rate_per_s", "writers_late_s", "drain_us", "pg_us", "statements_per_message"),
    *("lag_p50_ms", "lag_p99_ms", "lag_max_ms"),
)


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The section (see the module docstring). A harness failure is reported as a problem
    of a skipped section, so the other sections' results are still written."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {"skipped": "the section runs on PostgreSQL"}
    try:
        return _measure(mode, log)
    except Exception as exc:
        log("trickle failed:\n" + traceback.format_exc())
        return {"skipped": f"failed: {exc}", "problems": [f"trickle: failed: {exc}"]}


def _measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    from bench import trickle_run
    from outbox.models import RegionOutbox, ShardLease

    load_start = list(os.getloadavg())
    plan = PLANS[mode]
    tables = [RegionOutbox._meta.db_table, ShardLease._meta.db_table]
    server = _server_settings()
    vacuum_every = _vacuum_every(server)
    sides, note = _sides(mode, log)
    tag = 0

    def one(side: cpu_sides.Side, rate: int) -> dict[str, Any]:
        nonlocal tag
        tag += 1 << 40  # object identifiers unique across the section
        return trickle_run.run(side, rate, plan, WRITERS, SHARDS, tag, tables, vacuum_every)

    if mode != "smoke":  # unmeasured: each side's first run on its fresh database
        for side in sides:
            one(side, plan.rates[0])
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        rate: {side.name: [] for side in sides} for rate in plan.rates
    }
    for round_ in range(plan.rounds):
        order = sides if round_ % 2 == 0 else list(reversed(sides))
        for rate in plan.rates:
            for side in order:
                done = one(side, rate)
                runs[rate][side.name].append(done)
                log(
                    f"trickle round {round_ + 1}, {rate}/s, {side.name}: "
                    f"{done['rate_per_s']:.0f}/s written, drain {done['drain_us']:.0f} µs, "
                    f"PostgreSQL {done['pg_us']:.0f} µs, {_cell(done['statements_per_message'], 2)}"
                    f" statements a message, lag p99 {_ms(done['lag_p99_ms'])} ms"
                )
    rows = [_row(rate, runs[rate]) for rate in plan.rates]
    problems = [
        f"trickle {run['target_per_s']}/s, {run['side']}: {problem}"
        for rate in plan.rates
        for side_runs in runs[rate].values()
        for run in side_runs
        for problem in run["problems"]
    ]
    first = {name: side_runs[0] for name, side_runs in runs[plan.rates[0]].items()}
    result: dict[str, Any] = {
        "baseline_commit": BASELINE,
        "sides": {
            side.name: {"label": side.label, "database": side.database, **first[side.name]["drain"]}
            for side in sides
        },
        "note": note,
        "writers": WRITERS,
        "writers_code": "each side's own: bench/trickle_writer.py run by the side's "
        "interpreter, importing the side's outbox and bench.outboxes",
        "shards": SHARDS,
        "plan": {"rates": list(plan.rates), "seconds": plan.seconds, "warmup_s": plan.warmup_s},
        "rounds": plan.rounds,
        "server": server,
        "vacuum_stand_in_every_s": vacuum_every or None,
        "rows": rows,
        "runs": {str(rate): by_side for rate, by_side in runs.items()},
        "load_average_at_start": load_start,
        "load_average_at_end": list(os.getloadavg()),
        "problems": problems,
    }
    result["goals"] = _goals(rows)
    return result


def _sides(mode: str, log: Callable[[str], None]) -> tuple[list[cpu_sides.Side], str | None]:
    """The baseline (unless smoke mode finds it missing) and the head, each with its
    database made afresh and migrated by its own tree; and the note saying why the
    baseline is left out, if it is."""
    from bench import trickle_run
    from bench.db import DEFAULT_DB

    database = os.environ.get("OUTBOX_BENCH_DB", DEFAULT_DB) + "_trickle_"
    sides, note = [cpu_sides.head(database + "head")], None
    try:
        build = mode != "smoke"
        sides.insert(0, cpu_sides.baseline(BASELINE, database + "baseline", build, log))
    except cpu_sides.Unavailable as exc:
        note = f"baseline {BASELINE} left out: {exc}"
        log(f"trickle: {note}")
    for side in sides:
        trickle_run.migrate(side)
    return sides, note


def _row(rate: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One line of the table: each side's medians and its runs, and the ratios."""
    row: dict[str, Any] = {"target_per_s": rate}
    for name, side_runs in runs.items():
        for key in MEDIANS:
            values = [run[key] for run in side_runs if run[key] is not None]
            row[f"{name}_{key}"] = statistics.median(values) if values else None
        row[f"{name}_drain_us_runs"] = [run["drain_us"] for run in side_runs]
        row[f"{name}_pg_us_runs"] = [run["pg_us"] for run in side_runs]
        row[f"{name}_pg_parts_us"] = {
            part: statistics.median(run["pg_parts_us"][part] for run in side_runs)
            for part in [*PG_PARTS, "other"]
        }
    for key in ("drain_us", "pg_us", "statements_per_message"):
        baseline, head = row.get(f"baseline_{key}"), row.get(f"head_{key}")
        row[f"{key}_ratio"] = head / baseline if baseline and head is not None else None
    return row


def _goals(rows: list[dict[str, Any]]) -> dict[str, bool | None]:
    by_rate = {row["target_per_s"]: row for row in rows}
    half = by_rate.get(HALF_AT, {}).get("drain_us_ratio")
    lag = by_rate.get(LAG_AT, {}).get("head_lag_p99_ms")
    return {
        f"drain_cpu_at_{HALF_AT}_at_most_half_of_baseline": None if half is None else half <= 0.5,
        f"lag_p99_at_{LAG_AT}_within_{LAG_P99_GOAL_MS:.0f}_ms": (
            None if lag is None else lag <= LAG_P99_GOAL_MS
        ),
    }


def _vacuum_every(server: dict[str, str]) -> float:
    configured = os.environ.get("OUTBOX_BENCH_VACUUM_EVERY")
    if configured:
        return float(configured)
    return VACUUM_EVERY_S if server.get("autovacuum") == "off" else 0.0


def _server_settings() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('autovacuum', 'synchronous_commit', 'server_version')"
        )
        return dict(cursor.fetchall())


def markdown(result: dict[str, Any]) -> list[str]:
    sides = result["sides"]
    plan = result["plan"]
    lines = [
        f"{result['writers']} writer processes commit one message per transaction at a "
        f"fixed rate, one message per shard over {result['shards']:,} shards, for "
        f"{plan['seconds']:.0f} s a rate; one `drain_outboxes --loop` process delivers them. "
        f"Measured from {plan['warmup_s']:.0f} s after the writers start to their end: the "
        "drain process's CPU time (user + system, /proc) and PostgreSQL's (the server "
        "processes serving the side's database, the drain's connections and the writers' "
        "(their transactions included), with the server's own processes"
        + (" and the stand-in for autovacuum" if result["vacuum_stand_in_every_s"] else "")
        + "), per message delivered; the statements the drain sent per message (its calls "
        "of psycopg's execute, executemany, commit and rollback); the lag from commit "
        "return to receiver start. Written/s is the writers' rate in the window; writers "
        "late, how long after the schedule's end their last commit came (a writer behind "
        "its schedule writes flat out until it has caught up). Each side is its own "
        "interpreter, tree and database, the writers included (`bench/trickle_writer.py` "
        "run by the side's interpreter, with its `outbox` and `bench.outboxes`); the sides "
        f"alternate, median of {result['rounds']} round(s) (after one unmeasured run each, "
        "but in smoke mode). Load "
        f"{result['load_average_at_start'][0]:.1f} → {result['load_average_at_end'][0]:.1f}.",
        "",
        *[
            f"- {name}: {side['label']}, `{side['outbox_file']}`, Python {side['python']}, "
            f"Django {side['django']}, psycopg {side['psycopg']} ({side['psycopg_impl']})"
            for name, side in sides.items()
        ],
    ]
    if result["note"]:
        lines += ["", f"Note: {result['note']}."]
    names = list(sides)
    lines += [
        "",
        "| rate | side | written/s | writers late (s) | drain µs/msg | PostgreSQL µs/msg "
        "| statements/msg | lag p50 ms | lag p99 ms | lag max ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        for name in names:
            lines.append(
                f"| {row['target_per_s']:,}/s | {name} | {_cell(row[f'{name}_rate_per_s'], 0)} "
                f"| {_cell(row[f'{name}_writers_late_s'], 2)} "
                f"| {_cell(row[f'{name}_drain_us'], 0)} | {_cell(row[f'{name}_pg_us'], 0)} "
                f"| {_cell(row[f'{name}_statements_per_message'], 2)} "
                f"| {_ms(row[f'{name}_lag_p50_ms'])} | {_ms(row[f'{name}_lag_p99_ms'])} "
                f"| {_ms(row[f'{name}_lag_max_ms'])} |"
            )
    lines += [
        "",
        "PostgreSQL's CPU per message by what it served (µs): the drain's connections, the "
        "writers', the server's own processes and the autovacuum stand-in; client "
        "connections to other databases (someone else's work) are left out of the figure.",
        "",
        "| rate | side | drain's connections | writers' | server's own | vacuum "
        "| other databases (left out) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        for name in names:
            parts = row[f"{name}_pg_parts_us"]
            lines.append(
                f"| {row['target_per_s']:,}/s | {name} | "
                + " | ".join(_cell(parts[part], 0) for part in [*PG_PARTS, "other"])
                + " |"
            )
    lines += [
        "",
        f"The drain's statements by wall time (from the call to its return) in the first "
        f"measured run at {result['plan']['rates'][0]:,}/s, over the drain's life; calls "
        "per message of that run:",
        "",
        "| side | statement (its start) | calls/msg | ms a call |",
        "|---|---|---:|---:|",
    ]
    first_rate = str(result["plan"]["rates"][0])
    for name in names:
        run = result["runs"][first_rate][name][0]
        for timing in run["drain_statement_times"][:4]:
            text = timing["statement"][:70].replace("|", "\\|")
            lines.append(
                f"| {name} | `{text}` | {timing['calls'] / max(run['messages'], 1):.2f} "
                f"| {timing['seconds'] * 1000 / max(timing['calls'], 1):.2f} |"
            )
    if "baseline" in names:
        lines += [
            "",
            "| rate | drain: head ÷ baseline | PostgreSQL: head ÷ baseline "
            "| statements: head ÷ baseline |",
            "|---|---:|---:|---:|",
            *[
                f"| {row['target_per_s']:,}/s | {_cell(row['drain_us_ratio'], 2)} "
                f"| {_cell(row['pg_us_ratio'], 2)} "
                f"| {_cell(row['statements_per_message_ratio'], 2)} |"
                for row in result["rows"]
            ],
        ]
    lines += ["", "Goals: " + ", ".join(f"{k}: {_goal(v)}" for k, v in result["goals"].items())]
    return lines


def _goal(value: bool | None) -> str:
    return "n/a" if value is None else ("met" if value else "not met")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
