"""Wake-up: how soon an idle `drain_outboxes --loop` delivers a message written with
`flush=False`, and what the NOTIFY costs the write.

- **Latency**: a real `drain_outboxes --loop` runs in a subprocess (`serve("loop")`,
  the bench settings, a 30 s poll interval so that only a
  notification explains a fast delivery), idle. This process writes N messages, one
  per transaction, each inside `outbox_context(transaction.atomic(), flush=False)`, and
  notes `time.perf_counter()` as the COMMIT returns; the worker's receiver notes it as it
  starts and prints it. `perf_counter` is CLOCK_MONOTONIC, one clock for every process
  of the machine. Each write waits for the previous delivery and a short random gap, so
  the loop is idle every time.
- **Floor**: the same writes and the same trigger, received by psycopg alone
  (`serve("floor")`): LISTEN, then on each notification one statement that
  claims and reads the due rows and one that deletes them (two durable commits, like the
  engine's claim+read and settle); the receiver starts when the first returns.
- **NOTIFY cost on a write**: the same write path (`flush=False`, so only the write is
  timed) with the table's trigger enabled and disabled, in alternating blocks of the
  same run, a LISTEN connection open; the ratio of the mean write times.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outbox import OutboxCategory, OutboxScope

TITLE = "Wake-up of an idle drain loop (PostgreSQL LISTEN/NOTIFY)"
ROOT = Path(__file__).resolve().parent.parent
LOOP_INTERVAL_SECONDS = 30.0
# messages through the loop, through the floor; writes per variant, block size
SIZES = {
    "smoke": (20, 15, 100, 50),
    "quick": (300, 200, 2_000, 100),
    "full": (1_000, 500, 5_000, 100),
}

# two writer processes: seconds they write, seconds per trigger phase (not in smoke mode)
CONCURRENT = {"quick": (8.0, 0.5), "full": (30.0, 0.5)}


class WakeupCategory(OutboxCategory):
    WAKEUP = 931


class WakeupScope(OutboxScope):
    WAKEUP = 931, {WakeupCategory.WAKEUP}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def _write(i: int) -> float:
    """One message in its own transaction, left to the drain; when its COMMIT returned."""
    from django.db import transaction

    from outbox import outbox_context
    from outbox.models import RegionOutbox

    with outbox_context(transaction.atomic(), flush=False):
        RegionOutbox(
            shard_scope=WakeupScope.WAKEUP,
            shard_identifier=i % 100 + 1,
            category=WakeupCategory.WAKEUP,
            object_identifier=i,
            payload={"i": i},
        ).save()
    return time.perf_counter()


class Receiver:
    """A subprocess that prints `WAKE <object> <perf_counter>` as each receiver starts."""

    def __init__(self, role: str, log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-c", f"from bench.wakeup import serve; serve({role!r})"],
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.wait_line("READY", 120.0)
        if role == "loop":
            _wait_for_listener(self.log_path)

    def wait_line(self, prefix: str, timeout: float) -> list[str]:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.popen.stdout], [], [], max(remaining, 0))
            if not ready:
                raise RuntimeError(f"no {prefix} in {timeout}s:\n{self.log_path.read_text()}")
            line = self.popen.stdout.readline()
            if not line:
                raise RuntimeError(f"receiver exited:\n{self.log_path.read_text()}")
            if line.startswith(prefix):
                return line.split()

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)


def _wait_for_listener(log_path: Path, timeout: float = 60.0) -> None:
    """Until the loop's LISTEN connection shows up: from then on no write is missed."""
    from django.db import connection

    from outbox.backends.postgresql.notify import APPLICATION_NAME

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity "
                "WHERE application_name = %s AND datname = current_database()",
                [APPLICATION_NAME],
            )
            if cursor.fetchone():
                return
        time.sleep(0.05)
    raise RuntimeError(f"the drain loop never listened:\n{log_path.read_text()}")


def _latencies(role: str, messages: int, log_dir: Path) -> list[float]:
    """Commit-returned to receiver-start, in ms, for `messages` writes to an idle `role`."""
    receiver = Receiver(role, log_dir / f"wakeup-{role}.log")
    latencies = []
    try:
        time.sleep(0.5)  # past its first round: idle
        for i in range(messages + 5):  # 5 warm-up writes
            committed = _write(i)
            _, received, at = receiver.wait_line("WAKE", 10.0)
            if int(received) != i:
                raise RuntimeError(f"{role}: expected message {i}, received {received}")
            if i >= 5:
                latencies.append((float(at) - committed) * 1000)
            time.sleep(random.uniform(0.02, 0.05))  # the loop settles and goes idle
    finally:
        receiver.stop()
    return latencies


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(ms),
        "p90_ms": _percentile(ms, 0.90),
        "p99_ms": _percentile(ms, 0.99),
        "max_ms": max(ms),
        "samples": len(ms),
    }


def _set_trigger(enabled: bool) -> None:
    from django.db import connection

    from outbox.backends.postgresql.notify import TRIGGER
    from outbox.models import RegionOutbox

    table = connection.ops.quote_name(RegionOutbox._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {table} {'ENABLE' if enabled else 'DISABLE'} TRIGGER {TRIGGER}"
        )


def _write_cost(iterations: int, block: int) -> dict[str, Any]:
    """Mean µs per write with the trigger and without, alternating blocks."""
    import psycopg

    from bench.db import conninfo, reset
    from outbox.backends.postgresql.notify import channel
    from outbox.models import RegionOutbox

    spent = {True: 0.0, False: 0.0}
    with psycopg.connect(**conninfo(), autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel(RegionOutbox)}"')
        for round_ in range(-1, iterations // block):  # round -1: warm-up
            for enabled in (True, False) if round_ % 2 else (False, True):
                _set_trigger(enabled)
                started = time.perf_counter()
                for i in range(block):
                    _write(i)
                if round_ >= 0:
                    spent[enabled] += time.perf_counter() - started
                for _ in listener.notifies(timeout=0.0):
                    pass
            reset()
    _set_trigger(True)
    with_us, without_us = (spent[k] / iterations * 1e6 for k in (True, False))
    return {
        "notify_write_cost_ratio": with_us / without_us,
        "write_us_with_trigger": with_us,
        "write_us_without_trigger": without_us,
        "write_iterations": iterations,
    }


def write_for(budget: float) -> dict[str, Any]:
    """A writer process of the concurrent cost: writes until `budget` seconds passed;
    returns when each COMMIT returned."""
    deadline = time.perf_counter() + budget
    base, commits = os.getpid() * 1_000_000, []
    while time.perf_counter() < deadline:
        commits.append(_write(base + len(commits)))
    return {"commits": commits}


def _toggle(
    seconds: float, phase: float, done: threading.Event, log: list[tuple[float, bool]]
) -> None:
    """Switch the trigger on and off every `phase` seconds; note when each phase began."""
    import psycopg

    from bench.db import conninfo
    from outbox.backends.postgresql.notify import TRIGGER
    from outbox.models import RegionOutbox

    table = f'"{RegionOutbox._meta.db_table}"'
    with psycopg.connect(**conninfo(), autocommit=True) as conn:
        enabled = False
        while not done.wait(phase):
            enabled = not enabled
            conn.execute(
                f"ALTER TABLE {table} {'ENABLE' if enabled else 'DISABLE'} TRIGGER {TRIGGER}"
            )
            log.append((time.perf_counter(), enabled))


def _concurrent_cost(seconds: float, phase: float) -> dict[str, Any]:
    """Commits per second of two writer processes at full speed, trigger on vs off: one
    run, the trigger switched every `phase` seconds, so drift hits both alike.
    Commits that notify take a database-wide lock until they are done, one at a time."""
    from bench.db import reset
    from bench.workers import run_processes

    _set_trigger(False)
    done, phases = threading.Event(), []
    toggler = threading.Thread(target=_toggle, args=(seconds, phase, done, phases))
    toggler.start()
    try:
        run = run_processes("bench.wakeup.write_for", 2, seconds)
    finally:
        done.set()
        toggler.join()
        _set_trigger(True)
        reset()
    commits = sorted(t for result in run.results for t in result["commits"])
    counted = {True: [0, 0.0], False: [0, 0.0]}  # commits, seconds
    for (start, enabled), (end, _) in itertools.pairwise(phases):
        start += 0.05  # past the ALTER TABLE's lock
        if start < commits[0] or end > commits[-1]:
            continue  # the writers were not both writing yet, or any more
        counted[enabled][0] += bisect.bisect(commits, end) - bisect.bisect(commits, start)
        counted[enabled][1] += end - start
    on, off = (counted[k][0] / counted[k][1] for k in (True, False))
    return {
        "notify_write_cost_ratio_2_writers": off / on,
        "writes_per_s_2_writers_with_trigger": on,
        "writes_per_s_2_writers_without_trigger": off,
    }


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    from django.db import connection

    from bench.db import reset
    from outbox.backends.postgresql.notify import sync_triggers

    if connection.vendor != "postgresql":
        return {"skipped": "LISTEN/NOTIFY needs PostgreSQL"}
    messages, floor_messages, iterations, block = SIZES[mode]
    sync_triggers("default", enabled=True)  # what `migrate` does with OUTBOX_NOTIFY on
    reset()
    log_dir = Path(tempfile.mkdtemp(prefix="outbox-wakeup-"))
    loop = _summary(_latencies("loop", messages, log_dir))
    log(f"wakeup: drain loop p50 {loop['p50_ms']:.2f} ms, p99 {loop['p99_ms']:.2f} ms")
    floor = _summary(_latencies("floor", floor_messages, log_dir))
    log(f"wakeup: floor p50 {floor['p50_ms']:.2f} ms, p99 {floor['p99_ms']:.2f} ms")
    reset()
    cost = _write_cost(iterations, block)
    log(
        "wakeup: write with NOTIFY trigger / without = {notify_write_cost_ratio:.3f} "
        "({write_us_with_trigger:.0f} / {write_us_without_trigger:.0f} µs)".format(**cost)
    )
    if mode != "smoke":
        cost.update(_concurrent_cost(*CONCURRENT[mode]))
        log(
            "wakeup: 2 writers, without trigger / with = {notify_write_cost_ratio_2_writers:.3f} "
            "({writes_per_s_2_writers_without_trigger:.0f} / "
            "{writes_per_s_2_writers_with_trigger:.0f} writes/s)".format(**cost)
        )
    problems = []
    if loop["p50_ms"] > 5.0 or loop["p99_ms"] > 20.0:
        problems.append(
            f"wakeup: p50 {loop['p50_ms']:.2f} ms / p99 {loop['p99_ms']:.2f} ms, goal 5 / 20 ms"
        )
    return {
        **loop,
        "poll_interval_seconds": LOOP_INTERVAL_SECONDS,
        "floor": floor,
        "floor_ratio_p50": loop["p50_ms"] / floor["p50_ms"],
        **cost,
        **({"problems": problems} if mode == "full" else {}),
    }


def markdown(result: dict[str, Any]) -> list[str]:
    floor = result["floor"]
    return [
        f"An idle `drain_outboxes --loop` (poll interval {result['poll_interval_seconds']:.0f} s), "
        "one message per transaction written with `flush=False`: from the writer's COMMIT "
        "returning to the receiver starting in the worker process "
        f"({result['samples']} messages).",
        "",
        "| | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
        "| django-outboxes, `drain_outboxes --loop` | **{p50_ms:.2f} ms** | {p90_ms:.2f} ms | "
        "**{p99_ms:.2f} ms** | {max_ms:.2f} ms |".format(**result),
        "| floor: psycopg LISTEN, claim+read, settle | {p50_ms:.2f} ms | {p90_ms:.2f} ms | "
        "{p99_ms:.2f} ms | {max_ms:.2f} ms |".format(**floor),
        "",
        "NOTIFY cost on a write (the default write path, `flush=False`, statement-level "
        "trigger on vs off, alternating blocks): "
        f"**{result['notify_write_cost_ratio']:.3f}x** "
        f"({result['write_us_with_trigger']:.0f} µs vs {result['write_us_without_trigger']:.0f} µs "
        f"per write, {result['write_iterations']:,} writes each).",
        *(
            [
                "",
                "Two writer processes at full speed: "
                f"{result['writes_per_s_2_writers_without_trigger']:,.0f} writes/s without "
                f"the trigger, {result['writes_per_s_2_writers_with_trigger']:,.0f} with it: "
                f"**{result['notify_write_cost_ratio_2_writers']:.3f}x** the time per write.",
            ]
            if "notify_write_cost_ratio_2_writers" in result
            else []
        ),
    ]


def _serve_loop() -> None:
    """The drain loop under test, with a receiver that prints when it starts."""
    from django.conf import settings
    from django.core.management import call_command

    from outbox.signals import process_region_outbox

    settings.OUTBOX_LOOP_INTERVAL_SECONDS = LOOP_INTERVAL_SECONDS

    def receive(sender: Any, object_identifier: int, **kwargs: Any) -> None:
        print(f"WAKE {object_identifier} {time.perf_counter()}", flush=True)

    process_region_outbox.connect(receive, sender=WakeupCategory.WAKEUP, weak=False)
    print("READY", flush=True)  # the loop listens before its first round
    call_command("drain_outboxes", "--loop")


def _serve_floor() -> None:
    """psycopg alone: LISTEN; per notification, claim+read then settle."""
    import psycopg

    from bench.db import conninfo
    from outbox.backends.postgresql.notify import channel
    from outbox.models import RegionOutbox

    table = f'"{RegionOutbox._meta.db_table}"'
    claim_read = (
        f"UPDATE {table} SET last_attempt_at = now() WHERE id IN ("
        f"  SELECT id FROM {table} WHERE scheduled_for <= now() AND last_attempt_at IS NULL"
        "  ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
        ") RETURNING id, object_identifier, payload"
    )
    settle = f"DELETE FROM {table} WHERE id = ANY(%s)"
    with (
        psycopg.connect(**conninfo(), autocommit=True) as listener,
        psycopg.connect(**conninfo(), autocommit=True) as conn,
    ):
        listener.execute(f'LISTEN "{channel(RegionOutbox)}"')
        print("READY", flush=True)
        while True:
            for _ in listener.notifies(stop_after=1):
                rows = conn.execute(claim_read).fetchall()
                started = time.perf_counter()
                for _, object_identifier, _ in rows:
                    print(f"WAKE {object_identifier} {started}", flush=True)
                conn.execute(settle, [[row[0] for row in rows]])


def serve(role: str) -> None:
    """The receiving process (`role` "loop" or "floor"); run by `Receiver`."""
    from bench.db import setup_django

    setup_django()
    {"loop": _serve_loop, "floor": _serve_floor}[role]()
