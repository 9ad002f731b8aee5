"""Measure each contender on each shape: reset, load the same rows, drain, check, rate.

A drain runs in fresh worker processes (`bench.workers`) with a time budget: a contender
that has not emptied the backlog by then stops and its rate is what it retired in that
time (reported as `complete: false`). Rows retired are counted from the database, not
from the contender's own report.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from bench.shapes import Shape
from bench.workers import run_processes


@dataclass(frozen=True)
class Contender:
    """A way of draining a shape: where its rows live, which worker runs, how many."""

    name: str
    title: str
    target: str
    processes: int = 1
    # "outbox": RegionOutbox rows; "procrastinate": one job per row; a key of PEERS: the
    # peer package's own table, loaded and counted by its module
    queue: str = "outbox"
    lock: bool = False  # procrastinate jobs carry lock = their shard
    coalesces: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Peer:
    """A peer Django outbox package, measured when it is installed."""

    module: str  # load(shape), left(), clear(), run(budget, batch_size), BATCH_SIZE
    package: str
    flag: str  # the bench.settings flag that says it is installed
    install: str
    python: tuple[int, int] = (3, 10)  # the oldest Python it runs on

    def missing(self) -> str | None:
        """Why it is left out of this run, or None when it is in."""
        from django.conf import settings

        if getattr(settings, self.flag, False):
            return None
        if sys.version_info < self.python:
            running = ".".join(map(str, sys.version_info[:2]))
            return f"needs Python {'.'.join(map(str, self.python))}+, this is {running}"
        return f"not installed ({self.install})"


# The peers' contenders: queue name -> peer. BATCH_SIZE in each module is the batch the
# peer runs at, its fastest documented one (bench/README.md, "The peers").
PEERS = {
    "domain_events": Peer(
        "bench.contenders.domain_events",
        "django-domain-events",
        "HAS_DOMAIN_EVENTS",
        "pip install -e '.[bench]'",
    ),
    "reliable_outbox": Peer(
        "bench.contenders.reliable_outbox",
        "django-reliable-outbox",
        "HAS_RELIABLE_OUTBOX",
        "pip install django-reliable-outbox",
        python=(3, 12),
    ),
}
_reported_missing: set[str] = set()


def _peer_module(queue: str) -> Any:
    return importlib.import_module(PEERS[queue].module)


def peer_contenders() -> list[Contender]:
    """The peers that are installed; each other one is left out with a line on stderr."""
    found = []
    for queue, peer in PEERS.items():
        missing = peer.missing()
        if missing:
            if queue not in _reported_missing:
                _reported_missing.add(queue)
                print(f"bench: {peer.package} {missing}: left out", file=sys.stderr, flush=True)
            continue
        batch = _peer_module(queue).BATCH_SIZE
        found.append(
            Contender(
                queue,
                f"{peer.package} {metadata.version(peer.package)}, 1 process, batch {batch}",
                f"{peer.module}.run",
                queue=queue,
                coalesces=False,
                kwargs={"batch_size": batch},
            )
        )
    return found


def contenders(batch_rows: int, with_procrastinate: bool) -> list[Contender]:
    found = [
        Contender(
            "raw_limit",
            "raw SQL limit (psycopg, 1 process)",
            "bench.contenders.raw.run",
            coalesces=False,
            kwargs={"batch_rows": batch_rows},
        ),
        Contender(
            "raw_leased",
            "raw SQL + a lease row per shard (psycopg, 1 process)",
            "bench.contenders.raw_leased.run",
            coalesces=False,
            kwargs={"batch_rows": batch_rows},
        ),
        Contender("drain_1p", "django-outboxes, 1 process", "bench.contenders.drain.run"),
        Contender(
            "drain_2p", "django-outboxes, 2 processes", "bench.contenders.drain.run", processes=2
        ),
    ]
    if with_procrastinate:
        found += [
            Contender(
                "procrastinate",
                "procrastinate, 1 worker",
                "bench.contenders.procrastinate_jobs.run",
                queue="procrastinate",
                coalesces=False,
            ),
            Contender(
                "procrastinate_lock",
                "procrastinate, 1 worker, lock = shard",
                "bench.contenders.procrastinate_jobs.run",
                queue="procrastinate",
                lock=True,
                coalesces=False,
            ),
        ]
    found += peer_contenders()
    found.append(
        Contender(
            "reference",
            "reference design (ORM, 1 process)",
            "bench.contenders.reference.run",
        )
    )
    return found


def _load(contender: Contender, shape: Shape) -> int:
    from bench.db import analyze, load_shape, reset

    reset()
    if contender.queue == "procrastinate":
        from bench.contenders.procrastinate_jobs import defer_shape

        loaded = defer_shape(shape, lock=contender.lock)
        analyze()
        return loaded
    if contender.queue in PEERS:
        return int(_peer_module(contender.queue).load(shape))
    return load_shape(shape)


def _left(contender: Contender) -> int:
    from bench.db import outbox_rows

    if contender.queue == "procrastinate":
        from bench.contenders.procrastinate_jobs import remaining_jobs

        return sum(remaining_jobs().values())
    if contender.queue in PEERS:
        return int(_peer_module(contender.queue).left())
    return outbox_rows()


def _clear(contender: Contender) -> None:
    """Empty a peer's table once counted, so its rows weigh on no later contender."""
    if contender.queue in PEERS:
        _peer_module(contender.queue).clear()


def check(contender: Contender, shape: Shape, result: dict[str, Any]) -> list[str]:
    """What is wrong with a finished drain (empty list: nothing)."""
    problems = []
    label = f"{shape.name}/{contender.name}"
    calls, retired = result["receiver_calls"], result["rows_retired"]
    if result["complete"]:
        if result["rows_left"]:
            problems.append(f"{label}: reported complete with {result['rows_left']} rows left")
        low = shape.groups if contender.coalesces else shape.rows
        if not low <= calls <= shape.rows:
            problems.append(f"{label}: {calls} receiver calls for {shape.rows} rows, {low} groups")
    if retired > 0 and calls == 0:
        problems.append(f"{label}: {retired} rows retired without a receiver call")
    if result.get("failures"):
        problems.append(f"{label}: {result['failures']} delivery failures")
    return problems


def measure_drain(contender: Contender, shape: Shape, budget: float) -> dict[str, Any]:
    """Load `shape` for `contender`, drain it within `budget` seconds, and describe it."""
    started = time.perf_counter()
    loaded = _load(contender, shape)
    load_seconds = time.perf_counter() - started
    if loaded != shape.rows:
        raise RuntimeError(f"{contender.name}: loaded {loaded} rows, expected {shape.rows}")
    run = run_processes(contender.target, contender.processes, budget, **contender.kwargs)
    left = _left(contender)
    _clear(contender)
    retired = loaded - left
    workers = run.results
    complete = left == 0 and all(worker.get("complete", True) for worker in workers)
    result: dict[str, Any] = {
        "title": contender.title,
        "processes": contender.processes,
        "rows_loaded": loaded,
        "rows_retired": retired,
        "rows_left": left,
        "complete": complete,
        "seconds": run.seconds,
        "wall_seconds": run.wall_seconds,
        "per_s": retired / run.seconds if run.seconds > 0 else 0.0,
        "receiver_calls": sum(int(worker.get("receiver_calls", 0)) for worker in workers),
        "failures": sum(int(worker.get("failures", 0)) for worker in workers),
        "load_seconds": load_seconds,
        "workers": [
            {k: v for k, v in worker.items() if k not in {"started", "finished"}}
            for worker in workers
        ],
    }
    result["problems"] = check(contender, shape, result)
    return result
