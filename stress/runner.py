"""The runner: start writers and 4 drainers, inject faults, wait for the backlog to drain.

Drainers are real `manage.py drain_outboxes --loop` processes with the stress settings.
A supervisor restarts any drainer or writer that exits early (a drainer killed by a fault
or crashed by a lost connection). Every fault is recorded with its time for the checker.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRAINERS = 4


@dataclass
class Plan:
    """Size of one run."""

    name: str
    messages: int
    shards: int
    writers: int
    seconds: float  # how long the writers spread their messages over
    fault_every: float  # seconds between faults (cycling through the kinds)
    drain_timeout: float = 300.0
    max_faults: int = 10_000


SHORT = Plan(
    "short",
    messages=3000,
    shards=200,
    writers=2,
    seconds=30,
    fault_every=4.5,
    max_faults=len(["fail", "hang", "kill", "terminate", "writer_kill"]),
)
FULL = Plan("full", messages=100_000, shards=1000, writers=2, seconds=300, fault_every=20)
FAULT_KINDS = ["fail", "hang", "kill", "terminate", "writer_kill"]


@dataclass
class Proc:
    role: str  # "drainer" or "writer"
    index: int
    generation: int
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Run:
    plan: Plan
    tmp: Path
    env: dict[str, str]
    procs: dict[str, Proc] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    writers_done: set[int] = field(default_factory=set)

    def start_drainer(self, index: int, generation: int) -> None:
        name = f"drainer-{index}-{generation}"
        args = [
            sys.executable,
            "-m",
            "django",
            "drain_outboxes",
            "--loop",
            "--progress-every",
            "0",
            "--settings=stress.settings",
            "--pythonpath=.",
        ]
        self._start("drainer", index, generation, name, args)

    def start_writer(self, index: int, generation: int) -> None:
        name = f"writer-{index}-{generation}"
        p = self.plan
        args = [
            sys.executable,
            "-m",
            "stress.writer",
            str(index),
            str(p.writers),
            str(generation),
            str(p.shards),
            str(p.messages),
            str(p.seconds),
        ]
        self._start("writer", index, generation, name, args)

    def _start(self, role: str, index: int, gen: int, name: str, args: list[str]) -> None:
        env = {**self.env, "STRESS_PROCESS": name}
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.procs[f"{role}-{index}"] = Proc(role, index, gen, popen, log)

    def supervise(self) -> None:
        """Restart drainers that exited; restart writers that died before finishing."""
        for key, proc in list(self.procs.items()):
            code = proc.popen.poll()
            if code is None:
                continue
            if proc.role == "writer" and code == 0:
                self.writers_done.add(proc.index)
                del self.procs[key]
                continue
            self.restarts.append(
                {"at": time.time(), "process": key, "pid": proc.popen.pid, "exit": code}
            )
            if proc.role == "drainer":
                self.start_drainer(proc.index, proc.generation + 1)
            else:
                self.start_writer(proc.index, proc.generation + 1)

    def drainers(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.role == "drainer"]

    def inject(self, kind: str, rng: random.Random) -> None:
        """Inject one fault of this kind and record it."""
        from stress import db
        from stress.models import Conn, Control, Journal

        now = time.time()
        record: dict[str, Any] = {"kind": kind, "at": now}
        lease = float(self.env.get("STRESS_LEASE_SECONDS", "5"))
        recent = list(
            Journal.objects.filter(start__gt=now - 5).values_list("shard", flat=True)[:200]
        )
        shard = rng.choice(recent) if recent else rng.randint(1, self.plan.shards)
        if kind == "fail":
            Control.objects.create(kind="fail", shard=shard, until=now + 3)
            record.update(shard=shard, until=now + 3)
        elif kind == "hang":
            Control.objects.create(kind="hang", shard=shard, seconds=lease * 2 + 2)
            record.update(shard=shard, seconds=lease * 2 + 2)
        elif kind in ("kill", "terminate"):
            proc = rng.choice(self.drainers())
            record.update(pid=proc.popen.pid, process=f"drainer-{proc.index}-{proc.generation}")
            if kind == "kill":
                proc.popen.send_signal(signal.SIGKILL)
                proc.popen.wait(10)
                time.sleep(1.0)
                self.supervise()
            else:
                ids = list(
                    Conn.objects.filter(pid=proc.popen.pid).values_list("server_id", flat=True)
                )
                record["connections"] = db.kill_server_connections(ids)
        elif kind == "writer_kill":
            writers = [p for p in self.procs.values() if p.role == "writer"]
            if not writers:
                record["skipped"] = "no writer running"
            else:
                proc = rng.choice(writers)
                marker = self.tmp / f"writer-{proc.index}.stall"
                marker.unlink(missing_ok=True)
                control = Control.objects.create(kind="stall")
                deadline = time.monotonic() + 10
                while not marker.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                record.update(pid=proc.popen.pid, in_transaction=marker.exists())
                proc.popen.send_signal(signal.SIGKILL)
                proc.popen.wait(10)
                control.delete()
                self.supervise()
        self.faults.append(record)
        print(
            f"  fault {kind}: {json.dumps({k: v for k, v in record.items() if k != 'kind'})}",
            flush=True,
        )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.popen.wait(20)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)


def execute(plan: Plan, tmp: Path, faults: bool = True) -> dict[str, Any]:
    """Run the plan; return what the checker needs besides the tables."""
    from outbox.models import RegionOutbox

    env = {
        **os.environ,
        "STRESS_TMP": str(tmp),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    run = Run(plan, tmp, env)
    rng = random.Random(7)
    started = time.time()
    for i in range(DRAINERS):
        run.start_drainer(i, 0)
    for i in range(plan.writers):
        run.start_writer(i, 0)
    kinds = list(FAULT_KINDS)
    next_fault = time.monotonic() + plan.fault_every
    hard_stop = time.monotonic() + plan.seconds * 4 + plan.drain_timeout
    drained_at = None
    try:
        while time.monotonic() < hard_stop:
            run.supervise()
            writing = len(run.writers_done) < plan.writers
            if (
                faults
                and writing
                and len(run.faults) < plan.max_faults
                and time.monotonic() >= next_fault
            ):
                run.inject(kinds[len(run.faults) % len(kinds)], rng)
                next_fault = time.monotonic() + plan.fault_every
            if not writing and not RegionOutbox.objects.exists():
                drained_at = time.time()
                break
            time.sleep(0.2)
    finally:
        run.stop_all()
    return {
        "faults": run.faults,
        "restarts": run.restarts,
        "seconds": time.time() - started,
        "drained": drained_at is not None,
        "left_in_outbox": RegionOutbox.objects.count(),
        "lease_seconds": float(env.get("STRESS_LEASE_SECONDS", "5")),
    }
