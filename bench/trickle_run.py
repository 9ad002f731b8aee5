"""One run of the trickle section (`bench.trickle`): one side's writers at a fixed rate
for a fixed time, its `drain_outboxes --loop` process (`bench/trickle_drain.py`) and
writer processes (`bench/trickle_writer.py`), each run by the side's interpreter with the
side's tree alone on PYTHONPATH, on the side's database; and what the harness samples.

CPU comes from /proc/<pid>/stat (utime + stime, every thread), sampled at the start and
the end of the measured window: of the drain process, and of every PostgreSQL server
process listed in `pg_stat_activity`, sorted by what it serves:

- ``drain``: the drain's connections (their application name, `bench.sustained_settings`);
- ``writers``: the other client connections to the side's database, the writers';
- ``auxiliary``: the server's own processes (WAL writer, checkpointer, background writer,
  autovacuum and replication launchers, autovacuum workers);
- ``vacuum``: the harness's stand-in for autovacuum where the server runs none (a plain
  VACUUM of the outbox and lease tables every VACUUM_EVERY_S, as `bench.sustained` does);
- ``other``: client connections to other databases: someone else's work on the server,
  reported and left out of PostgreSQL's figure.

A backend present at both samples counts its difference, one that appeared in between
all of its time; one that ended in between is missed (none of the side's does: the
writers and the drain connect before the window and stay connected).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from bench.cpu_sides import Side
from bench.db import conninfo
from bench.sustained_drain import first_starts, stop_gracefully, tail_of
from bench.sustained_monitor import DRAIN_APPLICATION, cpu_seconds

BENCH = Path(__file__).resolve().parent
HARNESS_APPLICATION = "outbox-bench-trickle-harness"
VACUUM_APPLICATION = "outbox-bench-trickle-vacuum"
PG_PARTS = ("drain", "writers", "auxiliary", "vacuum")  # PostgreSQL's figure: their sum
READY_TIMEOUT_S = 60.0
EMPTY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class Plan:
    rates: tuple[int, ...]  # commits a second, all writers together
    seconds: float  # the writers' time at each rate
    warmup_s: float  # left out of the window: the drain's first round, Django's first save
    rounds: int


@dataclass
class Sample:
    at: float
    drain_cpu_s: float
    # pid -> (what it serves, CPU seconds)
    backends: dict[int, tuple[str, float]]


def side_env(side: Side, settings: str, **extra: str) -> dict[str, str]:
    """The environment of a side's process: its tree alone on PYTHONPATH, this script's
    folder kept off sys.path, its database and Django settings."""
    return {
        **os.environ,
        "PYTHONPATH": str(side.tree),
        "PYTHONSAFEPATH": "1",
        "OUTBOX_BENCH_DB": side.database,
        "DJANGO_SETTINGS_MODULE": settings,
        **extra,
    }


def migrate(side: Side) -> None:
    """The side's database, made afresh and migrated by the side's own tree."""
    from bench.db import create_database

    create_database(side.database)
    done = subprocess.run(
        [str(side.python), "-m", "django", "migrate", "--verbosity", "0"],
        cwd=side.tree,
        env=side_env(side, "bench.settings"),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"migrate on the {side.name} side: {done.stderr.strip()[-800:]}")


def _own(side: Side, file: str, what: str) -> str:
    """Check that a process of the side imported the side's `outbox`; its file."""
    imported = Path(file).resolve()
    if not imported.is_relative_to(side.tree.resolve()):
        raise RuntimeError(f"the {side.name} side's {what} imported {imported}, not its own outbox")
    return str(imported)


class Drain:
    """The side's `bench/trickle_drain.py` process."""

    def __init__(self, side: Side, folder: Path) -> None:
        self.starts_log = folder / "receiver-starts.log"
        self.statements_log = folder / "statements.log"
        self.timings = folder / "timings.json"
        self.output = folder / "drain.out"
        hello = folder / "drain-hello.json"
        env = side_env(
            side,
            "bench.sustained_settings",
            OUTBOX_BENCH_SUSTAINED_LOG=str(self.starts_log),
            OUTBOX_BENCH_TRICKLE_HELLO=str(hello),
            OUTBOX_BENCH_TRICKLE_STATEMENTS=str(self.statements_log),
            OUTBOX_BENCH_TRICKLE_TIMINGS=str(self.timings),
        )
        with open(self.output, "wb") as output:
            self.process = subprocess.Popen(
                [str(side.python), str(BENCH / "trickle_drain.py")],
                cwd=side.tree,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self.side, self._hello = side, hello
        self.hello: dict[str, Any] = {}

    def wait_ready(self) -> None:
        """Until Django is set up in it (the probe says so), and half a second more."""
        ready = Path(str(self.starts_log) + ".ready")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the {self.side.name} side's drain did not start: {self.tail()}"
                )
            time.sleep(0.05)
        self.hello = json.loads(self._hello.read_text(encoding="utf-8"))
        self.hello["outbox_file"] = _own(self.side, self.hello["outbox_file"], "drain")
        time.sleep(0.5)  # past Django's setup: let it reach its first poll

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> int:
        return stop_gracefully(self.process, STOP_TIMEOUT_S)

    def tail(self, lines: int = 20) -> str:
        return tail_of(self.output, lines)

    def starts(self) -> tuple[dict[int, float], int]:
        """Each message's first receiver start, and how many starts were repeats."""
        return first_starts(self.starts_log)

    def statement_times(self, top: int = 8) -> list[dict[str, Any]]:
        """The statements the drain spent the most wall time in, over its life."""
        try:
            rows: list[dict[str, Any]] = json.loads(self.timings.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return rows[:top]

    def statements_at(self, moment: float) -> float | None:
        """The statements sent by `moment`, interpolated between the two notes around it."""
        notes = []
        for line in self.statements_log.read_text(encoding="ascii").splitlines():
            at, _, count = line.partition(" ")
            if count:
                notes.append((float(at), int(count)))
        before = [note for note in notes if note[0] <= moment]
        after = [note for note in notes if note[0] >= moment]
        if not before or not after:
            return None
        (t0, c0), (t1, c1) = before[-1], after[0]
        return float(c0) if t1 == t0 else c0 + (c1 - c0) * (moment - t0) / (t1 - t0)


def _writer(
    side: Side, index: int, writers: int, shards: int, rate: int, plan: Plan, tag: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            str(side.python),
            str(BENCH / "trickle_writer.py"),
            *map(str, (index, writers, shards, rate, plan.seconds, tag)),
        ],
        cwd=side.tree,
        env=side_env(side, "bench.settings"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,  # its stderr is the bench's: a traceback shows in the run's log
    )


def _line(process: subprocess.Popen[str], what: str) -> dict[str, Any]:
    stdout: IO[str] | None = process.stdout
    assert stdout is not None
    line = stdout.readline()
    if not line:
        raise RuntimeError(f"{what} exited ({process.wait()}) without answering, see the log")
    answer: dict[str, Any] = json.loads(line)
    return answer


@dataclass
class Vacuumer:
    """A plain VACUUM of the tables every `every_s` seconds from `first_at` on, on a
    connection the samples sort as ``vacuum``."""

    database: str
    tables: list[str]
    every_s: float
    first_at: float
    runs: int = 0
    failure: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Vacuumer:
        self._thread = threading.Thread(target=self._run, name="trickle-vacuum", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60.0)

    def _run(self) -> None:
        names = ", ".join(f'"{table}"' for table in self.tables)
        try:
            with psycopg.connect(
                **conninfo(self.database), autocommit=True, application_name=VACUUM_APPLICATION
            ) as conn:
                due = self.first_at
                while not self._stop.wait(max(0.0, due - time.time())):
                    conn.execute(f"VACUUM {names}")
                    self.runs += 1
                    due += self.every_s
        except Exception as exc:
            self.failure = f"vacuum stand-in: {exc!r}"


def _sample(conn: psycopg.Connection[Any], database: str, drain_pid: int) -> Sample:
    rows = conn.execute(
        "SELECT pid, datname, application_name, backend_type FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid()"
    ).fetchall()
    at = time.time()
    backends = {}
    for pid, datname, application, backend_type in rows:
        if backend_type != "client backend":
            part = "auxiliary"
        elif datname != database:
            part = "other"
        elif application == DRAIN_APPLICATION:
            part = "drain"
        elif application == VACUUM_APPLICATION:
            part = "vacuum"
        elif application == HARNESS_APPLICATION:
            continue
        else:
            part = "writers"
        cpu = cpu_seconds(pid)
        if cpu is not None:
            backends[pid] = (part, cpu)
    drain = cpu_seconds(drain_pid)
    if drain is None:
        raise RuntimeError("the drain process is gone")
    return Sample(at, drain, backends)


def _pg_cpu(first: Sample, last: Sample) -> dict[str, float]:
    """CPU seconds of each part of the server between two samples."""
    seconds = dict.fromkeys([*PG_PARTS, "other"], 0.0)
    for pid, (part, cpu) in last.backends.items():
        before = first.backends.get(pid)
        seconds[part] += cpu - (before[1] if before and before[0] == part else 0.0)
    return seconds


def _percentile(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def run(
    side: Side,
    rate: int,
    plan: Plan,
    writers: int,
    shards: int,
    tag: int,
    tables: list[str],
    vacuum_every: float,
) -> dict[str, Any]:
    """The side's writers at `rate` for `plan.seconds` with a fresh drain; the figures
    of the window from `plan.warmup_s` after the writers start to their end."""
    with tempfile.TemporaryDirectory(prefix="outbox-trickle-") as folder:
        drain = Drain(side, Path(folder))
        processes: list[subprocess.Popen[str]] = []
        vacuumer: Vacuumer | None = None
        try:
            with psycopg.connect(
                **conninfo(side.database), autocommit=True, application_name=HARNESS_APPLICATION
            ) as conn:
                processes = [
                    _writer(side, index, writers, shards, rate, plan, tag)
                    for index in range(writers)
                ]
                drain.wait_ready()  # the writers start meanwhile
                for index, process in enumerate(processes):
                    hello = _line(process, f"the {side.name} side's writer {index}")
                    _own(side, hello["outbox_file"], "writer")
                go = time.time() + 0.2
                for process in processes:
                    assert process.stdin is not None
                    process.stdin.write(json.dumps({"go": go}) + "\n")
                    process.stdin.flush()
                if vacuum_every:
                    vacuumer = Vacuumer(side.database, tables, vacuum_every, go + vacuum_every)
                    vacuumer.start()
                time.sleep(max(0.0, go + plan.warmup_s - time.time()))
                first = _sample(conn, side.database, drain.pid)
                time.sleep(max(0.0, go + plan.seconds - time.time()))
                last = _sample(conn, side.database, drain.pid)
                written = [
                    _line(process, f"the {side.name} side's writer {index}")
                    for index, process in enumerate(processes)
                ]
                if vacuumer is not None:
                    vacuumer.stop()
                cleared = _wait_empty(conn, tables[0])
                names = ", ".join(f'"{table}"' for table in tables)
                conn.execute(f"VACUUM {names}")  # untimed: every run starts alike
        finally:
            if vacuumer is not None:
                vacuumer.stop()
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
            exit_status = drain.stop()
        starts, repeats = drain.starts()
        statements = [drain.statements_at(sample.at) for sample in (first, last)]
        statements_note = None
        if None in statements:  # not a failed check: the figure is left out, with why
            notes = drain.statements_log.read_text(encoding="ascii").splitlines()
            statements_note = (
                f"statements not counted: window {first.at:.3f} to {last.at:.3f}, "
                f"{len(notes)} notes, {notes[:1]} to {notes[-1:]}"
            )
        hello, tail, timings = drain.hello, drain.tail(), drain.statement_times()
    commits = {message: at for result in written for message, at in result["commits"]}
    window = {message: at for message, at in commits.items() if first.at <= at <= last.at}
    lags = sorted((starts[m] - at) * 1000 for m, at in window.items() if m in starts)
    delivered = sum(1 for at in starts.values() if first.at <= at <= last.at)
    per = max(delivered, 1)
    pg = _pg_cpu(first, last)
    problems = []
    lost = sum(1 for message in commits if message not in starts)
    if lost:
        problems.append(f"{lost:,} of {len(commits):,} messages never reached their receiver")
    if not cleared:
        problems.append(f"backlog not empty {EMPTY_TIMEOUT_S:.0f}s after the writers stopped")
    if exit_status != 0:
        problems.append(f"the drain exited with {exit_status}: {tail}")
    if vacuumer is not None and vacuumer.failure:
        problems.append(vacuumer.failure)
    sent = None
    if statements[0] is not None and statements[1] is not None:
        sent = statements[1] - statements[0]
    return {
        "side": side.name,
        "target_per_s": rate,
        "seconds": plan.seconds,
        "messages": len(commits),
        # The writers keep to a schedule: behind it, they write flat out until they have
        # caught up or its last slot has passed, so the rate is the window's.
        "rate_per_s": len(window) / (last.at - first.at),
        "writers_late_s": max(commits.values(), default=go) - (go + plan.seconds),
        "window_s": last.at - first.at,
        "window_commits": len(window),
        "window_delivered": delivered,
        "drain_cpu_s": last.drain_cpu_s - first.drain_cpu_s,
        "drain_us": (last.drain_cpu_s - first.drain_cpu_s) * 1e6 / per,
        "pg_cpu_s": pg,
        "pg_us": sum(pg[part] for part in PG_PARTS) * 1e6 / per,
        "pg_parts_us": {part: seconds * 1e6 / per for part, seconds in pg.items()},
        "statements_per_message": None if sent is None else sent / per,
        "statements_note": statements_note,
        "lag_p50_ms": _percentile(lags, 0.5),
        "lag_p99_ms": _percentile(lags, 0.99),
        "lag_max_ms": lags[-1] if lags else None,
        "load_average_at_end": list(os.getloadavg()),
        "lost": lost,
        "repeats": repeats,
        "vacuum_stand_in_runs": vacuumer.runs if vacuumer is not None else 0,
        "drain": hello,
        # Over the drain's life (its start, the warm-up and the clearing included).
        "drain_statement_times": timings,
        "problems": problems,
    }


def _wait_empty(conn: psycopg.Connection[Any], table: str) -> bool:
    deadline = time.monotonic() + EMPTY_TIMEOUT_S
    while time.monotonic() < deadline:
        if conn.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (0,):
            return True
        time.sleep(0.1)
    return False
