"""The runner: start writers and drainers (4 unless the plan says), inject faults, wait
for the backlog to drain, sampling its size (rows pending) every second.

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
from stress.backlog import Backlog

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
    drainers: int = DRAINERS
    drain_after: float = 0.0  # drainers start this long after the writers
    fault_backlog: int = 0  # faults while this many rows pend (instead of while writing)
    prefill: int = 0  # of `messages`, committed in bulk before anything starts

    @property
    def max_faults(self) -> int:
        return len(self.kinds) if self.one_of_each else 10_000

    def but(
        self,
        messages: int | None = None,
        kinds: list[str] | None = None,
        fault_every: float | None = None,
        **sizes: Any,
    ) -> Plan:
        """This plan with another message count (at the same pace: the writing time
        scales with it), other fault kinds, another interval between faults; `sizes`:
        `seconds` (writing time), `writers`, `drainers`, `drain_after`, `fault_backlog`,
        `prefill` where given."""
        plan = self
        if messages:
            seconds = max(self.seconds * messages / self.messages, 10.0)
            timeout = max(self.drain_timeout, messages / 200)
            plan = replace(plan, messages=messages, seconds=seconds, drain_timeout=timeout)
        if kinds:
            plan = replace(plan, kinds=tuple(kinds))
        if fault_every:
            plan = replace(plan, fault_every=fault_every)
        return replace(plan, **{k: v for k, v in sizes.items() if v})


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
    broker: Any = None  # the relay leg's `stress.broker.Broker` (its proxy), or None

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

    def inject(self, kind: str, rng: random.Random, backlog: int) -> None:
        """Inject one fault of this kind and record it (with the rows pending)."""
        record: dict[str, Any] = {"kind": kind, "at": time.time(), "backlog": backlog}
        faults.ALL_KINDS[kind](self, rng, record)
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


def execute(
    plan: Plan, tmp: Path, inject_faults: bool = True, broker: Any = None
) -> dict[str, Any]:
    """Run the plan; return what the checker needs besides the tables. With `broker`
    (the relay leg), every process publishes through its proxy."""
    from outbox.models import RegionOutbox

    env = {
        **os.environ,
        "STRESS_TMP": str(tmp),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if broker is not None:
        env.update(broker.start())
    run = Run(plan, tmp, env, broker=broker)
    if plan.prefill:
        from stress.writer import prefill

        prefill(plan.writers, plan.shards, plan.prefill)
    started = time.time()
    run.writing_until = started + plan.seconds
    for i in range(plan.writers):
        run.start_writer(i, 1 if plan.prefill else 0)
    backlog = Backlog()
    try:
        drained = _until_drained(run, inject_faults, backlog)
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
        "max_backlog": backlog.largest,
        "max_backlog_at_s": round(backlog.at - started, 1) if backlog.at else None,
    }


def _until_drained(run: Run, inject_faults: bool, backlog: Backlog) -> bool:
    """Start the drainers (after `drain_after`), supervise, inject faults in turn while
    the writers write (or, with `fault_backlog`, while that many rows pend), and wait
    until they are done and the outbox is empty (False: the hard stop came first)."""
    from outbox.models import RegionOutbox

    plan = run.plan
    rng = random.Random(7)
    drain_at = time.monotonic() + plan.drain_after
    next_fault = drain_at + plan.fault_every
    hard_stop = drain_at + plan.seconds * 4 + plan.drain_timeout
    draining = False
    while time.monotonic() < hard_stop:
        if not draining and time.monotonic() >= drain_at:
            for i in range(plan.drainers):
                run.start_drainer(i, 0)
            draining = True
        run.supervise()
        backlog.sample()
        writing = len(run.writers_done) < plan.writers
        backlogged = backlog.rows >= plan.fault_backlog if plan.fault_backlog else writing
        injected = [f for f in run.faults if not f.get("skipped")]  # skipped: again
        if (
            inject_faults
            and draining
            and backlogged
            and len(injected) < plan.max_faults
            and time.monotonic() >= next_fault
        ):
            run.inject(plan.kinds[len(injected) % len(plan.kinds)], rng, backlog.rows)
            next_fault = time.monotonic() + plan.fault_every
        if draining and not writing and not RegionOutbox.objects.exists():
            return True
        time.sleep(0.2)
    return False
