"""The runner: start writers and 4 drainers, inject faults, wait for the backlog to drain.

Drainers are real `manage.py drain_outboxes --loop` processes with the stress settings.
A supervisor restarts any drainer or writer that exits early (a drainer killed by a fault
or crashed by a lost connection). Every fault (`stress/faults.py`) is recorded with its
time for the checker.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stress import faults

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
    one_of_each: bool = False  # stop after one fault of each kind
    kinds: tuple[str, ...] = tuple(faults.KINDS)  # injected in turn

    @property
    def max_faults(self) -> int:
        return len(self.kinds) if self.one_of_each else 10_000

    def but(self, messages: int | None, kinds: list[str] | None, fault_every: float | None) -> Plan:
        """This plan with another message count (at the same pace: the writing time
        scales with it), other fault kinds, or another interval between faults."""
        plan = self
        if messages:
            seconds = max(self.seconds * messages / self.messages, 10.0)
            plan = replace(plan, messages=messages, seconds=seconds)
        if kinds:
            plan = replace(plan, kinds=tuple(kinds))
        if fault_every:
            plan = replace(plan, fault_every=fault_every)
        return plan


# Short: one fault of each kind, all well before the writers stop writing.
SHORT = Plan(
    "short", messages=3000, shards=200, writers=2, seconds=40, fault_every=3.5, one_of_each=True
)
FULL = Plan("full", messages=100_000, shards=1000, writers=2, seconds=300, fault_every=15)


@dataclass
class Proc:
    role: str  # "drainer" or "writer"
    index: int
    generation: int
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}-{self.generation}"


@dataclass
class Run:
    plan: Plan
    tmp: Path
    env: dict[str, str]
    procs: dict[str, Proc] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    writers_done: set[int] = field(default_factory=set)
    writing_until: float = 0.0  # writers spread their messages until then (epoch)

    @property
    def lease(self) -> float:
        return float(self.env.get("STRESS_LEASE_SECONDS", "5"))

    @property
    def graceful_timeout(self) -> float:
        from django.conf import settings

        return float(settings.OUTBOX_GRACEFUL_TIMEOUT_SECONDS)

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
            str(self.writing_until),
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
            self.restart(proc)

    def restart(self, proc: Proc, cause: str = "") -> None:
        """Start the next generation of an exited process (`cause`: a planned stop)."""
        self.restarts.append(
            {
                "at": time.time(),
                "process": proc.name,
                "pid": proc.popen.pid,
                "exit": proc.popen.returncode,
                "cause": cause,
            }
        )
        if proc.role == "drainer":
            self.start_drainer(proc.index, proc.generation + 1)
        else:
            self.start_writer(proc.index, proc.generation + 1)

    def drainers(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.role == "drainer"]

    def inject(self, kind: str, rng: random.Random) -> None:
        """Inject one fault of this kind and record it."""
        record: dict[str, Any] = {"kind": kind, "at": time.time()}
        faults.KINDS[kind](self, rng, record)
        self.faults.append(record)
        shown = {k: v for k, v in record.items() if k != "kind"}
        print(f"  fault {kind}: {json.dumps(shown)}", flush=True)

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


def execute(plan: Plan, tmp: Path, inject_faults: bool = True) -> dict[str, Any]:
    """Run the plan; return what the checker needs besides the tables."""
    from outbox.models import RegionOutbox

    env = {
        **os.environ,
        "STRESS_TMP": str(tmp),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    run = Run(plan, tmp, env)
    started = time.time()
    run.writing_until = started + plan.seconds
    for i in range(DRAINERS):
        run.start_drainer(i, 0)
    for i in range(plan.writers):
        run.start_writer(i, 0)
    try:
        drained = _until_drained(run, inject_faults)
    finally:
        run.stop_all()
    return {
        "faults": run.faults,
        "restarts": run.restarts,
        "seconds": time.time() - started,
        "drained": drained,
        "left_in_outbox": RegionOutbox.objects.count(),
        "lease_seconds": run.lease,
        "graceful_timeout_s": run.graceful_timeout,
    }


def _until_drained(run: Run, inject_faults: bool) -> bool:
    """Supervise, inject faults in turn while the writers write, and wait until they are
    done and the outbox is empty (False: the hard stop came first)."""
    from outbox.models import RegionOutbox

    plan = run.plan
    rng = random.Random(7)
    next_fault = time.monotonic() + plan.fault_every
    hard_stop = time.monotonic() + plan.seconds * 4 + plan.drain_timeout
    while time.monotonic() < hard_stop:
        run.supervise()
        writing = len(run.writers_done) < plan.writers
        injected = [f for f in run.faults if not f.get("skipped")]  # skipped: again
        if (
            inject_faults
            and writing
            and len(injected) < plan.max_faults
            and time.monotonic() >= next_fault
        ):
            run.inject(plan.kinds[len(injected) % len(plan.kinds)], rng)
            next_fault = time.monotonic() + plan.fault_every
        if not writing and not RegionOutbox.objects.exists():
            return True
        time.sleep(0.2)
    return False
