"""The CPU-per-message section's drains counted in instructions, not seconds:
`python -m bench.cpu_instructions [--out FILE]`.

On a shared machine a drain's CPU time moves by 10-30 % from one round to the next
(`bench.cpu_per_message`), as much as the change it is meant to show. An instruction
count does not: `valgrind --tool=callgrind` counts what the process executes, every
thread of it, whatever else the machine runs. Each case runs the side's
`bench/cpu_driver.py` under callgrind twice, once with one drain of the shape and once
with two; the difference is one drain, start-up, imports and the writes cancelling out,
and divided by the messages of one drain it is instructions per message. The sides are
those of the CPU section (`bench.cpu_sides`: the baseline commit's worktree and
virtualenv, made when missing, and this tree), on databases of their own; two runs go
at once, on databases of their own too.

Smaller than the CPU section's shapes (callgrind runs a program some fifty times
slower): ordered streams of 200 shards x 100 objects and 20,000 shards of one message
each. A drain with concurrency times its slot threads' work (a 20 ms tick watches for
slow calls); under callgrind it runs fifty times longer, so those ticks weigh more than
they do in a real run: read its rows as an upper bound.

Needs valgrind (Debian's `valgrind` package); not one of `python -m bench`'s sections.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import cpu_sides

SHAPES = {"ordered streams, 200 x 100": (200, 100), "one message per shard, 20,000": (20_000, 1)}
CONCURRENCIES = (1, None)  # None: the side's default
RECEIVERS = {"count": "counts its calls", "kwargs": "copies its keyword arguments"}
LANES = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    options = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    load = os.getloadavg()
    sides = _sides()
    cases = [
        (side, shape, concurrency, receiver)
        for side in sides
        for shape, concurrency, receiver in itertools.product(SHAPES, CONCURRENCIES, RECEIVERS)
        # the baseline has no concurrency setting: it drains its one way in both rows
        if side.name == "head" or concurrency == 1
    ]
    # Each lane works through its cases in turn, on databases of its own.
    lanes = [cases[lane::LANES] for lane in range(LANES)]
    with ThreadPoolExecutor(LANES) as pool:
        done = pool.map(_run_lane, lanes, range(LANES))
        figures = {key: figure for lane in done for key, figure in lane.items()}
    lines = _markdown(sides, figures, load, os.getloadavg())
    print("\n".join(lines))
    if options.out:
        options.out.write_text("\n".join(lines) + "\n")


def _key(side: str, shape: str, concurrency: int | None, receiver: str) -> str:
    return f"{side} {shape} {concurrency} {receiver}"


def _sides() -> list[cpu_sides.Side]:
    from bench.cpu_per_message import BASELINE
    from bench.db import DEFAULT_DB, create_database

    database = os.environ.get("OUTBOX_BENCH_DB", DEFAULT_DB) + "_cpu_"
    sides = [
        cpu_sides.baseline(BASELINE, database + "baseline", True, print),
        cpu_sides.head(database + "head"),
    ]
    for side in sides:
        for lane in range(LANES):
            create_database(_database(side, lane))
    return sides


def _database(side: cpu_sides.Side, lane: int) -> str:
    return side.database if lane == 0 else f"{side.database}_{lane}"


def _run_lane(cases: list[Any], lane: int) -> dict[str, float]:
    """Instructions per message of each case, one case after another."""
    return {_key(side.name, *rest): _per_message(side, *rest, lane) for side, *rest in cases}


def _per_message(
    side: cpu_sides.Side, shape: str, concurrency: int | None, receiver: str, lane: int
) -> float:
    """Instructions per message of one drain: two drains less one."""
    shards, objects = SHAPES[shape]
    totals = []
    for drains in (1, 2):
        name = f"i{shards}"  # the driver keeps each shape's rows in a table of this name
        write = {"op": "write", "shape": name, "shards": shards, "objects_per_shard": objects}
        drain = {"op": "drain", "shape": name, "receiver": receiver, "concurrency": concurrency}
        commands = [write, *[drain] * drains]
        totals.append(_count(side, _database(side, lane), commands))
    return (totals[1] - totals[0]) / (shards * objects)


def _count(side: cpu_sides.Side, database: str, commands: list[dict[str, Any]]) -> int:
    env = {**os.environ, "PYTHONPATH": str(side.tree), "PYTHONSAFEPATH": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={folder}/callgrind.out",
                str(side.python),
                str(cpu_sides.DRIVER),
                database,
            ],
            input="".join(json.dumps(command) + "\n" for command in commands),
            capture_output=True,
            text=True,
            cwd=side.tree,
            env=env,
        )
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    drains = [answer for answer in answers if "messages" in answer]
    expected = commands[0]["shards"] * commands[0]["objects_per_shard"]
    if done.returncode or any(answer["messages"] != expected for answer in drains):
        raise RuntimeError(f"{side.name}: {done.stderr[-2000:]}\n{done.stdout[-2000:]}")
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"{side.name}: no instruction count in {done.stderr[-2000:]}")
    return int(found.group(1))


def _markdown(
    sides: list[cpu_sides.Side],
    figures: dict[str, float],
    load_start: tuple[float, ...],
    load_end: tuple[float, ...],
) -> list[str]:
    baseline, head = sides
    lines = [
        "## Drain instructions per message: the head against a baseline commit",
        "",
        f"`valgrind --tool=callgrind`, two drains less one, per message; baseline "
        f"{baseline.label}, {head.label}; load {load_start[0]:.1f} → {load_end[0]:.1f} "
        "(instruction counts do not depend on it).",
        "",
        "| shape | concurrency | receiver | baseline | head | head ÷ baseline |",
        "|---|---|---|---:|---:|---:|",
    ]
    for shape, concurrency, receiver in itertools.product(SHAPES, CONCURRENCIES, RECEIVERS):
        base = figures[_key(baseline.name, shape, 1, receiver)]
        mine = figures[_key(head.name, shape, concurrency, receiver)]
        lines.append(
            f"| {shape} | {concurrency or 'default'} | {RECEIVERS[receiver]} | "
            f"{base:,.0f} | {mine:,.0f} | {mine / base:.3f} |"
        )
    return lines


if __name__ == "__main__":
    main()
