"""Sustained load: writers and the drain at the same time, as in production.

Two writer processes (`bench.sustained_writer`) commit one message per transaction,
one message per shard over 2,000 shards, with `flush=False`; one
`python -m django drain_outboxes --loop` process delivers them, its receiver probe
(`bench.sustained_probe`) noting when each receiver starts. Lag is that start minus the
writer's commit return (`time.time()` on both sides, joined by message). The harness
samples the backlog every 0.1 s and the tables' dead tuples and size every second
(`bench.sustained_monitor`); where the server's autovacuum is off, it vacuums the outbox
and lease tables itself every 15 s. Three runs, the drain process
(`bench.sustained_drain`) running throughout:

1. full speed: the writers' rate, the backlog's maximum, and the clear time (the
   writers' last commit to the receiver start of the last message);
2. at 80 % of that rate: the lag;
3. at 80 % again, with a REPEATABLE READ transaction held open in the middle (it pins
   the vacuum horizon): drain rate, lag, dead tuples and table size before, during and
   after it, and how long after it ends the lag is back to normal.

The figures and their Markdown are worked out afterwards in `bench.sustained_figures`.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import sustained_figures as figures
from bench.sustained_drain import DrainProcess
from bench.sustained_monitor import Monitor, Pin, Vacuumer

TITLE = "Sustained load: writers and the drain at once"

WRITERS = 2
SHARDS = 2_000
FRACTION = 0.8
CLEAR_TIMEOUT_S = 120.0
# Per-table autovacuum settings of the operating docs, applied to the outbox and lease
# tables for the section (they matter only where the server runs autovacuum).
AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
}
# Where the server's autovacuum is off (as on CI servers), the section vacuums the two
# tables itself this often, as autovacuum would with `autovacuum_naptime = 15s`;
# OUTBOX_BENCH_VACUUM_EVERY overrides it (0: never).
VACUUM_EVERY_S = 15.0


@dataclass(frozen=True)
class Plan:
    full_speed_s: float
    at_80_s: float
    pin_before_s: float
    pin_hold_s: float
    pin_after_s: float


PLANS = {
    "smoke": Plan(1.0, 1.0, 0.5, 1.0, 1.0),
    "quick": Plan(8.0, 8.0, 5.0, 15.0, 10.0),
    "full": Plan(20.0, 20.0, 20.0, 60.0, 20.0),
}


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The section (see the module docstring). A harness failure is reported as a problem
    of a skipped section, so the other sections' results are still written."""
    try:
        return _measure(mode, log)
    except Exception as exc:
        log("sustained failed:\n" + traceback.format_exc())
        return {"skipped": f"failed: {exc}", "problems": [f"sustained: failed: {exc}"]}


def _measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    from bench.db import reset
    from outbox.conf import outbox_settings
    from outbox.models import RegionOutbox, ShardLease

    plan = PLANS[mode]
    outbox_table, lease_table = RegionOutbox._meta.db_table, ShardLease._meta.db_table
    reset()
    server = _server_settings()
    _set_autovacuum([outbox_table, lease_table], AUTOVACUUM)
    interval = float(
        os.environ.get("OUTBOX_BENCH_LOOP_INTERVAL") or outbox_settings.LOOP_INTERVAL_SECONDS
    )
    vacuum_every = _vacuum_every(server)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="outbox-sustained-") as folder:
        drain = DrainProcess(Path(folder))
        drain.start()
        monitor = Monitor(outbox_table, lease_table, drain.pid).start()
        vacuumer = Vacuumer([outbox_table, lease_table], vacuum_every)
        if vacuum_every:
            vacuumer.start()
        try:
            full = _write(1, plan.full_speed_s, None, monitor, drain, problems)
            log(
                f"sustained full speed: {full.rate:,.0f} msg/s, backlog max "
                f"{max(monitor.backlog_between(full.first, full.last), default=0):,}"
            )
            target = FRACTION * full.rate
            at_80 = _write(2, plan.at_80_s, target, monitor, drain, problems)
            log(f"sustained at 80 %: {at_80.rate:,.0f} msg/s (target {target:,.0f})")
            # The pinned run starts from vacuumed tables, as autovacuum would leave them
            # (where the server runs it; this one may not).
            vacuum_before = _vacuum([outbox_table, lease_table])
            pin = Pin(outbox_table, plan.pin_before_s, plan.pin_hold_s).start()
            pinned_seconds = plan.pin_before_s + plan.pin_hold_s + plan.pin_after_s
            pinned = _write(3, pinned_seconds, target, monitor, drain, problems)
            pin.join()
            vacuum = _vacuum([outbox_table, lease_table])
        finally:
            vacuumer.stop()
            monitor.stop()
            exit_status = drain.stop()
            _set_autovacuum([outbox_table, lease_table], None)
        starts, duplicates = drain.starts()
        if exit_status != 0:
            problems.append(f"sustained: the drain exited with {exit_status}: {drain.tail()}")
    for failure in (monitor.failure, pin.failure, vacuumer.failure):
        if failure:
            problems.append(f"sustained: {failure}")
    runs = {"full_speed": full, "at_80": at_80, "pinned": pinned}
    for name, run in runs.items():
        lost = sum(1 for message in run.commits if message not in starts)
        if lost:
            problems.append(f"sustained {name}: {lost:,} messages never reached their receiver")
    phases = {name: figures.summary(run, starts, monitor) for name, run in runs.items()}
    horizon = {
        **figures.pinned(pinned, pin, starts, monitor, plan.pin_hold_s),
        "vacuum_before": vacuum_before,
        "vacuum": vacuum,
    }
    result = {
        "writers": WRITERS,
        "shards": SHARDS,
        "loop_interval_s": interval,
        "server": server,
        "table_autovacuum": AUTOVACUUM,
        "vacuum_stand_in_every_s": vacuum_every or None,
        "vacuum_stand_in_runs": len(vacuumer.runs),
        "vacuum_stand_in_max_s": max((seconds for _, seconds in vacuumer.runs), default=None),
        "plan_s": asdict(plan),
        "writers_full_rate_per_s": full.rate,
        "backlog_max_rows": phases["full_speed"]["backlog_max"],
        "clear_s": phases["full_speed"]["clear_s"],
        "rate_80_per_s": at_80.rate,
        "lag_p50_ms": phases["at_80"]["lag_p50_ms"],
        "lag_p99_ms": phases["at_80"]["lag_p99_ms"],
        "pinned": horizon,
        "phases": phases,
        "duplicates": duplicates,
        "problems": problems,
    }
    result["goals"] = figures.goals(result)
    return result


def _write(
    phase: int,
    seconds: float,
    rate: float | None,
    monitor: Monitor,
    drain: DrainProcess,
    problems: list[str],
) -> figures.Run:
    """Run the writers for `seconds` (flat out, or at `rate` in all), then wait until
    the backlog is empty."""
    from bench.sustained_writer import WRITER_BITS
    from bench.workers import run_processes

    run = run_processes(
        "bench.sustained_writer.write",
        WRITERS,
        seconds,
        writers=WRITERS,
        shards=SHARDS,
        tag=phase << (WRITER_BITS + 8),
        rate=rate,
    )
    commits = {message: at for result in run.results for message, at in result["commits"]}
    per_writer = [result["messages"] for result in run.results]
    written = figures.Run(rate, run.seconds, commits, per_writer)
    if monitor.wait_for_empty(written.last, CLEAR_TIMEOUT_S) is None:
        problems.append(f"sustained phase {phase}: backlog not empty {CLEAR_TIMEOUT_S:.0f}s later")
    if not drain.alive():
        raise RuntimeError(f"sustained: the drain process died: {drain.tail()}")
    return written


def _vacuum(tables: list[str]) -> dict[str, Any]:
    """A plain VACUUM of the tables once the run is over, the drain idle: how long it
    takes, and the dead tuples and size it leaves (it truncates empty pages at the end)."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {', '.join(map(connection.ops.quote_name, tables))}")
        seconds = time.perf_counter() - started
        cursor.execute(
            "SELECT relname, n_dead_tup, pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [tables],
        )
        figures = {name: (dead, size) for name, dead, size in cursor.fetchall()}
    outbox, lease = (figures.get(table, (None, None)) for table in tables)
    return {
        "seconds": seconds,
        "outbox_dead": outbox[0],
        "outbox_kb": None if outbox[1] is None else outbox[1] // 1024,
        "lease_dead": lease[0],
        "lease_kb": None if lease[1] is None else lease[1] // 1024,
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
            "('autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_cost_delay', "
            "'synchronous_commit', 'server_version')"
        )
        return dict(cursor.fetchall())


def _set_autovacuum(tables: list[str], options: dict[str, str] | None) -> None:
    """Set the per-table autovacuum options, or reset them with None."""
    from django.db import connection

    names = list(AUTOVACUUM)
    with connection.cursor() as cursor:
        for table in tables:
            quoted = connection.ops.quote_name(table)
            if options is None:
                cursor.execute(f"ALTER TABLE {quoted} RESET ({', '.join(names)})")
            else:
                pairs = ", ".join(f"{name} = {value}" for name, value in options.items())
                cursor.execute(f"ALTER TABLE {quoted} SET ({pairs})")


def markdown(result: dict[str, Any]) -> list[str]:
    return figures.markdown(result)
