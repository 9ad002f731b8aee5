"""The faults the runner injects, one function per kind; each fills in its record.

- fail: receivers of one shard raise for 3 s (then recover);
- hang: the next receiver of one shard sleeps past the receiver deadline and the lease;
- kill: SIGKILL of a drainer;
- terminate: a drainer's connections killed server-side;
- writer_kill: a writer SIGKILLed inside its open transaction;
- graceful: SIGTERM to a drainer while its receiver is in flight (a `slow` call), then
  the facts the checker asserts: when it exited, which leases it still held;
- broker_cut (the relay leg only): every connection to the broker cut at the runner's
  proxy, and new ones refused, for a few seconds (`stress/broker.py`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import random

    from stress.runner import Run

SLOW_SECONDS = 2.0  # the call in flight at SIGTERM: below the receiver deadline (3 s)


def fail(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    from stress.models import Control

    shard = _busy_shard(run, rng)
    until = record["at"] + 3
    Control.objects.create(kind="fail", shard=shard, until=until)
    record.update(shard=shard, until=until)


def hang(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    from stress.models import Control

    shard = _busy_shard(run, rng)
    seconds = run.lease * 2 + 2
    Control.objects.create(kind="hang", shard=shard, seconds=seconds)
    record.update(shard=shard, seconds=seconds)


def kill(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    proc = rng.choice(run.drainers())
    record.update(pid=proc.popen.pid, process=proc.name)
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(10)
    record["done_at"] = time.time()
    time.sleep(1.0)
    run.supervise()


def terminate(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    from stress import db
    from stress.models import Conn

    proc = rng.choice(run.drainers())
    record.update(pid=proc.popen.pid, process=proc.name)
    ids = list(Conn.objects.filter(pid=proc.popen.pid).values_list("server_id", flat=True))
    record["connections"] = db.kill_server_connections(ids, proc.name)
    record["done_at"] = time.time()


def writer_kill(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    from stress.models import Control

    writers = [p for p in run.procs.values() if p.role == "writer"]
    if not writers:
        record["skipped"] = "no writer running"
        return
    proc = rng.choice(writers)
    marker = run.tmp / f"writer-{proc.index}.stall"
    marker.unlink(missing_ok=True)
    control = Control.objects.create(kind="stall", shard=proc.index)  # that writer only
    in_transaction = _wait_for(marker.exists, 10)
    record.update(pid=proc.popen.pid, in_transaction=in_transaction)
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(10)
    control.delete()
    run.supervise()


def graceful(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    """SIGTERM a drainer in the middle of a receiver call; time its exit."""
    from stress.models import Control

    control = Control.objects.create(kind="slow", seconds=SLOW_SECONDS)
    marker = run.tmp / f"slow-{control.pk}.json"
    if not _wait_for(marker.exists, 20):
        Control.objects.filter(pk=control.pk).delete()
        record["skipped"] = "no receiver call to slow down"
        return
    inflight = json.loads(marker.read_text())
    proc = next((p for p in run.drainers() if p.popen.pid == inflight["pid"]), None)
    if proc is None or proc.popen.poll() is not None:
        record["skipped"] = f"drainer {inflight['pid']} gone before SIGTERM"
        return
    held = _leases_of(inflight["pid"])
    record.update(
        pid=proc.popen.pid,
        process=proc.name,
        shard=inflight["shard"],
        call_started=inflight["at"],
        held_shards=len(held),
        lease_expires_at=held.get(inflight["shard"]),
        graceful_timeout_s=run.graceful_timeout,
    )
    record["term_at"] = time.time()
    proc.popen.send_signal(signal.SIGTERM)
    try:
        record["exit_code"] = proc.popen.wait(run.graceful_timeout + 10)
    except subprocess.TimeoutExpired:
        record["exit_code"] = None  # never exited: the checker reports it
        proc.popen.kill()
        proc.popen.wait(10)
    record["exit_at"] = time.time()
    record["exit_s"] = round(record["exit_at"] - record["term_at"], 3)
    record["leases_after_exit"] = len(_leases_of(proc.popen.pid))
    run.restart(proc, cause="graceful")


def broker_cut(run: Run, rng: random.Random, record: dict[str, Any]) -> None:
    if run.broker is None:
        record["skipped"] = "no broker: a relay run only (--relay amqp)"
        return
    record.update(run.broker.cut())


Fault = Callable[["Run", "random.Random", dict[str, Any]], None]

# The kinds a run injects unless told otherwise.
KINDS: dict[str, Fault] = {
    "fail": fail,
    "hang": hang,
    "kill": kill,
    "terminate": terminate,
    "writer_kill": writer_kill,
    "graceful": graceful,
}
# Kinds of the relay leg only.
BROKER_KINDS: dict[str, Fault] = {"broker_cut": broker_cut}
ALL_KINDS: dict[str, Fault] = {**KINDS, **BROKER_KINDS}
# The relay leg's kinds unless told otherwise: every kind, the broker cut among them.
RELAY_KINDS = ("fail", "hang", "kill", "broker_cut", "terminate", "writer_kill", "graceful")


def _busy_shard(run: Run, rng: random.Random) -> int:
    """A shard that received calls in the last 5 s (else any shard)."""
    from stress.models import Journal

    since = time.time() - 5
    recent = list(Journal.objects.filter(start__gt=since).values_list("shard", flat=True)[:200])
    return rng.choice(recent) if recent else rng.randint(1, run.plan.shards)


def _leases_of(pid: int) -> dict[int, float]:
    """Shards whose live lease a process holds now: shard -> expiry (epoch seconds)."""
    from outbox.models import ShardLease

    held = ShardLease.objects.held().filter(holder__contains=f":{pid}:")
    rows = held.values_list("shard_identifier", "expires_at")
    return {shard: expires.timestamp() for shard, expires in rows}


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
