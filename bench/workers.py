"""Run a measured function in separate OS processes, released together, timed alike.

Each worker is a fresh interpreter (spawn start method) that starts Django, imports its
target and reports ready. Only then does the parent release all of them at once. Each
worker notes `time.perf_counter()` (CLOCK_MONOTONIC, shared by all processes on Linux)
right after its release and right after its function returns; the measured time is
from the first start to the last finish. Start-up cost (interpreter, Django, imports)
and result reporting are thus never measured, for any contender.
"""

from __future__ import annotations

import importlib
import multiprocessing
import queue
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

READY_TIMEOUT_SECONDS = 120.0
GRACE_SECONDS = 60.0


class WorkerFailed(RuntimeError):
    """A worker raised, died or ran out of time."""


@dataclass
class ProcessRun:
    """Time from the first worker's start to the last one's finish, and their results.

    `wall_seconds` is the parent's view (release to last result received), a check.
    """

    seconds: float
    wall_seconds: float
    results: list[dict[str, Any]] = field(default_factory=list)


def _resolve(target: str) -> Any:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _child(
    target: str,
    kwargs: dict[str, Any],
    ready: Any,
    start: Any,
    results: Any,
    index: int,
    budget: float,
) -> None:
    try:
        from bench.db import setup_django

        setup_django()
        function = _resolve(target)
        ready.put(index)
        if not start.wait(READY_TIMEOUT_SECONDS * 2):
            raise WorkerFailed("never released")
        started = time.perf_counter()
        result = function(budget=budget, **kwargs)
        finished = time.perf_counter()
        results.put((index, True, {**result, "started": started, "finished": finished}))
    except BaseException:
        results.put((index, False, traceback.format_exc()))
        ready.put(index)  # in case it failed before reporting ready


def _check_alive(workers: list[Any], reported: set[int], target: str) -> None:
    """Fail at once when a worker that owes a result has died without one."""
    for index, worker in enumerate(workers):
        if index not in reported and worker.exitcode is not None:
            raise WorkerFailed(f"{target}: worker {index} died (exit code {worker.exitcode})")


def run_processes(target: str, processes: int, budget: float, **kwargs: Any) -> ProcessRun:
    """Run `target(budget=budget, **kwargs)` in `processes` fresh processes at once.

    `target` is a dotted path to a function returning a JSON-able dict. It must stop by
    itself once `budget` seconds have passed (reporting what it did so far); a worker
    still running `GRACE_SECONDS` later is given up on and killed.
    """
    context = multiprocessing.get_context("spawn")
    ready, results, start = context.Queue(), context.Queue(), context.Event()
    workers = [
        context.Process(
            target=_child,
            args=(target, kwargs, ready, start, results, index, budget),
            name=f"bench-{target.rpartition('.')[2]}-{index}",
            daemon=True,
        )
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        ready_deadline = time.perf_counter() + READY_TIMEOUT_SECONDS
        for _ in workers:
            while True:
                if time.perf_counter() > ready_deadline:
                    raise WorkerFailed(f"{target}: workers not ready in {READY_TIMEOUT_SECONDS}s")
                try:
                    ready.get(timeout=1.0)
                    break
                except queue.Empty:
                    _check_alive(workers, set(), target)
        started = time.perf_counter()
        start.set()
        collected: dict[int, dict[str, Any]] = {}
        failures: dict[int, str] = {}
        deadline = started + budget + GRACE_SECONDS
        while len(collected) + len(failures) < processes:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise WorkerFailed(f"{target}: no result within {budget + GRACE_SECONDS:.0f}s")
            try:
                index, ok, payload = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                _check_alive(workers, {*collected, *failures}, target)
                continue
            if ok:
                collected[index] = payload
            else:
                failures[index] = f"worker {index}:\n{payload}"
        wall = time.perf_counter() - started
        if failures:
            raise WorkerFailed(f"{target} failed:\n" + "\n".join(failures.values()))
        ordered = [collected[index] for index in sorted(collected)]
        first = min(result["started"] for result in ordered)
        last = max(result["finished"] for result in ordered)
        return ProcessRun(last - first, wall, ordered)
    finally:
        for worker in workers:
            worker.join(timeout=10.0)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5.0)
