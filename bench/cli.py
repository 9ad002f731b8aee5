"""The one command: run every measurement side by side and write the results.

    python -m bench            # full run  -> bench/results/latest.{json,md,png}
    python -m bench --quick    # minutes   -> bench/results/quick.*
    python -m bench --smoke    # seconds   -> bench/results/smoke.*  (CI)

Exit status 1 when a check failed (a lost message, a wrong receiver count, a drain that
did not finish in smoke mode), so CI notices a harness or engine that rotted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


ONLY_BASE = "sync,write,drains,scale"


def only_all() -> str:
    """Every section: the base ones and the extra section modules present."""
    from bench import sections

    return ",".join([ONLY_BASE, *sections.MODULES])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--smoke",
        action="store_const",
        dest="mode",
        const="smoke",
        help="tiny sizes, well under a minute; for CI",
    )
    mode.add_argument(
        "--quick",
        action="store_const",
        dest="mode",
        const="quick",
        help="10k-row shapes, a few minutes; for iterating",
    )
    parser.set_defaults(mode="full")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--name", help="results file stem (default: latest, quick or smoke)")
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=2000,
        help="rows per batch for every contender (OUTBOX_BATCH_ROWS, LIMIT)",
    )
    parser.add_argument(
        "--batch-shards",
        type=int,
        default=100,
        help="shards one engine batch claims (OUTBOX_BATCH_SHARDS)",
    )
    parser.add_argument(
        "--budget", type=float, help="seconds each contender may drain one shape (default per mode)"
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated sections to run (default: all): "
        + ONLY_BASE
        + ", and the extra sections of bench/sections.py",
    )
    parser.add_argument("--contenders", help="comma-separated contender names (default: all)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of drains; each contender keeps its median (default 1)",
    )
    parser.add_argument(
        "--portable",
        action="store_true",
        help="turn the engine's PostgreSQL fast path off (OUTBOX_FAST_PATH)",
    )
    parser.add_argument(
        "--receiver",
        choices=("count", "kwargs"),
        default="count",
        help="the drained categories' receiver, and the raw loops' per-row call: one that "
        "counts its calls (default), or one that reads every keyword argument it gets",
    )
    parser.add_argument(
        "--no-procrastinate",
        action="store_true",
        help="leave procrastinate out even if it is installed",
    )
    return parser.parse_args(argv)


def log(started: float, message: str) -> None:
    print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)


def configure(args: argparse.Namespace) -> None:
    """Environment for this process and the workers it spawns, then Django."""
    default_db = "outbox_bench_smoke" if args.mode == "smoke" else "outbox_bench"
    os.environ.setdefault("OUTBOX_BENCH_DB", default_db)
    os.environ["OUTBOX_BENCH_BATCH_ROWS"] = str(args.batch_rows)
    os.environ["OUTBOX_BENCH_BATCH_SHARDS"] = str(args.batch_shards)
    os.environ["OUTBOX_BENCH_RECEIVER"] = args.receiver
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    if args.portable:
        os.environ["OUTBOX_BENCH_FAST_PATH"] = "0"
    from bench.db import create_database, migrate, setup_django

    create_database(os.environ["OUTBOX_BENCH_DB"])
    setup_django()
    migrate()


def run_drains(
    sizes: Any, budget: float, selected: list[Any], repeat: int, started: float
) -> tuple[dict[str, Any], list[str]]:
    """Every contender on every shape; with --repeat, rounds rotate the contenders' order
    and each keeps its median run (by rate), with all rates listed in `runs_per_s`."""
    from bench.runner import measure_drain

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    problems: list[str] = []
    for round_ in range(repeat):
        shift = round_ % len(selected)
        for shape in sizes.shapes():
            for contender in selected[shift:] + selected[:shift]:
                result = measure_drain(contender, shape, budget)
                runs.setdefault(shape.name, {}).setdefault(contender.name, []).append(result)
                problems += result["problems"]
                capped = "" if result["complete"] else f" (stopped, {result['rows_left']:,} left)"
                log(
                    started,
                    f"{shape.name:<17} {contender.name:<18} "
                    f"{result['rows_retired']:>9,} rows in {result['seconds']:7.2f}s = "
                    f"{result['per_s']:>10,.0f} rows/s, {result['receiver_calls']:,} calls"
                    f"{capped}",
                )
    results: dict[str, Any] = {}
    for shape in sizes.shapes():
        per_contender = {}
        for contender in selected:
            attempts = sorted(runs[shape.name][contender.name], key=lambda run: run["per_s"])
            chosen = attempts[(len(attempts) - 1) // 2]
            chosen["runs_per_s"] = [run["per_s"] for run in runs[shape.name][contender.name]]
            per_contender[contender.name] = chosen
        results[shape.name] = {"shape": shape.describe(), "contenders": per_contender}
    return results, problems


def run_scale(sizes: Any, started: float) -> tuple[dict[str, Any], list[str]]:
    """The engine on growing backlogs. A small backlog drains in a fraction of a second,
    so it is drained several times (up to 5, as many as fit in the largest backlog's
    rows) and keeps its median run; `runs_per_s` lists them all. Half of those runs
    come before the larger backlogs and half after, so a drift of this shared machine
    while the largest one drains weighs on both ends of the ratio alike."""
    from bench.runner import contenders, measure_drain
    from bench.sizes import scale_shape

    drain = next(c for c in contenders(0, False) if c.name == "drain_1p")
    largest = max(sizes.scale_rows)
    repeats = {rows: max(1, min(5, largest // rows)) for rows in sizes.scale_rows}
    schedule = [rows for rows in sizes.scale_rows for _ in range((repeats[rows] + 1) // 2)]
    schedule += [rows for rows in reversed(sizes.scale_rows) for _ in range(repeats[rows] // 2)]
    runs: dict[int, list[dict[str, Any]]] = {rows: [] for rows in sizes.scale_rows}
    problems: list[str] = []
    for rows in schedule:
        run = measure_drain(drain, scale_shape(rows), sizes.scale_budget)
        problems += run["problems"]
        runs[rows].append(run)
    steps = []
    for rows in sizes.scale_rows:
        ranked = sorted(runs[rows], key=lambda run: run["per_s"])
        result = {**ranked[(len(ranked) - 1) // 2], "runs_per_s": [r["per_s"] for r in runs[rows]]}
        steps.append({"backlog_rows": rows, "shards": scale_shape(rows).shards, **result})
        log(
            started,
            f"scale {rows:>9,} rows: {result['per_s']:>10,.0f} rows/s (median of "
            f"{len(runs[rows])}, {result['rows_retired']:,} in {result['seconds']:.1f}s"
            f"{'' if result['complete'] else ', stopped at budget'})",
        )
    first, last = steps[0], steps[-1]
    return {
        "shape": "ordered streams, 100 distinct objects per shard",
        "contender": "drain_1p",
        "budget_seconds": sizes.scale_budget,
        "steps": steps,
        "ratio": last["per_s"] / first["per_s"] if first["per_s"] else None,
        "ratio_of": f"{last['backlog_rows']:,} over {first['backlog_rows']:,} rows",
    }, problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    configure(args)

    from django.conf import settings

    from bench import report, sync_flush, write_overhead
    from bench import sections as extra_sections
    from bench.runner import contenders
    from bench.sizes import MODES

    sizes = MODES[args.mode]
    budget = args.budget or sizes.drain_budget
    only = args.only or only_all()
    sections = {part.strip() for part in only.split(",") if part.strip()}
    with_procrastinate = getattr(settings, "HAS_PROCRASTINATE", False) and not args.no_procrastinate
    selected = contenders(args.batch_rows, with_procrastinate)
    if args.contenders:
        wanted = {name.strip() for name in args.contenders.split(",")}
        selected = [contender for contender in selected if contender.name in wanted]
    if not getattr(settings, "HAS_PROCRASTINATE", False):
        log(started, "procrastinate is not installed (pip install -e '.[bench]'): left out")

    data: dict[str, Any] = report.header(args.mode, args.batch_rows, args.batch_shards, budget)
    data["repeat"] = args.repeat
    problems: list[str] = []
    log(
        started,
        f"mode {args.mode}, database {settings.DATABASES['default']['NAME']}, "
        f"engine backend {data['versions']['outbox_backend']}",
    )
    try:
        if "sync" in sections:
            data["sync_flush"] = sync_flush.measure(sizes.sync_iterations)
            log(
                started,
                "sync flush: p50 {p50_ms:.2f} ms, p99 {p99_ms:.2f} ms; "
                "{p50_over_floor:.2f}x its floor".format(**data["sync_flush"]),
            )
            log(
                started,
                "sync flush, prepared: p50 {p50_ms:.2f} ms, p99 {p99_ms:.2f} ms; "
                "{p50_over_floor:.2f}x its floor".format(**data["sync_flush"]["prepared"]),
            )
        if "write" in sections:
            data["write_overhead"] = write_overhead.measure(
                sizes.write_iterations, sizes.write_block, with_procrastinate
            )
            log(
                started,
                "write overhead: save+outbox / save = {ratio:.2f} (floor {sql_floor_ratio:.2f}); "
                "deferred {deferred_ratio:.2f} (floor {deferred_sql_floor_ratio:.2f})".format(
                    **data["write_overhead"]
                ),
            )
        if "drains" in sections:
            data["shapes"], found = run_drains(sizes, budget, selected, args.repeat, started)
            problems += found
        if "scale" in sections:
            data["scale"], found = run_scale(sizes, started)
            problems += found
        for name, module in extra_sections.available().items():
            if name in sections:
                log(started, f"section {name}")
                data[name] = module.measure(args.mode, lambda line: log(started, line))
                problems += data[name].pop("problems", [])
    finally:
        from bench.db import reset

        reset()
    if args.mode == "smoke":
        problems += report.incomplete(data)
    data["problems"] = problems
    data["total_seconds"] = time.perf_counter() - started
    report.summarize(data)
    # A partial run never replaces the published full run.
    partial = (
        args.mode == "full"
        and args.only is not None
        and set(sections) != set(only_all().split(","))
    )
    default_stem = "partial" if partial else args.mode
    stem = args.name or {"full": "latest"}.get(default_stem, default_stem)
    written = report.write(data, args.out or RESULTS, stem)
    log(started, "wrote " + ", ".join(str(path) for path in written))
    print(report.markdown(data))
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if problems:
        print(f"bench: {len(problems)} check(s) failed", file=sys.stderr)
        return 1
    print(f"bench: all checks passed in {data['total_seconds']:.0f}s", file=sys.stderr)
    return 0
