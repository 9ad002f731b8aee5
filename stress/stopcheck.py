"""The facts of each graceful stop (SIGTERM to a drainer with a receiver in flight).

Asserted per stop:
- exit: the process exited cleanly (status 0, or 3 when some receiver had failed during
  its life) within the graceful timeout + 1 s of the SIGTERM;
- in flight: the receiver call running at SIGTERM completed (its journal row exists,
  successful, started before and ended after the SIGTERM);
- nothing new: no receiver call of that process started after the SIGTERM was handled:
  `SIGNAL_LATENCY_S` after it was sent (the handler runs once the main thread has the
  GIL back from a slot thread, a few milliseconds; slots starting calls meanwhile cannot
  know of it yet);
- released: right after the exit, the process held no live lease, and another process
  resumed the shard of the call in flight within a lease TTL (`resume_s`: from when the
  shard had work due after that call ended; usually at once, the fault picks a shard
  with more work). `lease_left_s` is how long the lease would still have blocked the
  shard then, had it not been released.
"""

from __future__ import annotations

from typing import Any

from stress.journal import Call, Group, Write

SIGNAL_LATENCY_S = 0.05


def check_stops(
    faults: list[dict[str, Any]], calls: list[Call], writes: list[Write], lease: float
) -> list[dict[str, Any]]:
    stops = []
    for fault in faults:
        if fault["kind"] != "graceful" or fault.get("skipped"):
            continue
        stops.append(_one(fault, calls, writes, lease))
    return stops


def _one(
    fault: dict[str, Any], calls: list[Call], writes: list[Write], lease: float
) -> dict[str, Any]:
    pid, shard = fault["pid"], fault["shard"]
    term, exit_at = fault["term_at"], fault["exit_at"]
    mine = [c for c in calls if c.pid == pid]
    inflight = [c for c in mine if c.slow and c.shard == shard]
    completed = bool(inflight) and all(c.ok and c.start < term < c.end <= exit_at for c in inflight)
    # The shard paused when the call in flight ended; once it had work due again (at
    # once, usually), another process resumed it.
    paused = inflight[0].end if inflight else exit_at
    ready = _ready(shard, paused, calls, writes)
    resumed = [c.start for c in calls if c.shard == shard and c.pid != pid and c.start >= ready]
    resume_s = round(min(resumed) - ready, 3) if resumed else None
    expires = fault.get("lease_expires_at")
    stop = {
        "shard": shard,
        "exit_s": fault["exit_s"],
        "exit_code": fault["exit_code"],
        "inflight_s": round(inflight[0].end - term, 3) if inflight else None,
        "inflight_completed": completed,
        "calls_after_sigterm": sum(1 for c in mine if c.start > term + SIGNAL_LATENCY_S),
        "leases_after_exit": fault["leases_after_exit"],
        "resume_s": resume_s,
        "lease_left_s": round(expires - ready, 3) if expires and resumed else None,
    }
    stop["problems"] = _problems(stop, fault["graceful_timeout_s"], lease)
    return stop


def _problems(stop: dict[str, Any], graceful_timeout: float, lease: float) -> list[str]:
    problems = []
    if stop["exit_code"] not in (0, 3) or stop["exit_s"] > graceful_timeout + 1:
        problems.append("exit")
    if not stop["inflight_completed"]:
        problems.append("in-flight call not completed")
    if stop["calls_after_sigterm"]:
        problems.append("claimed after SIGTERM")
    if stop["leases_after_exit"]:
        problems.append("leases not released")
    if stop["resume_s"] is None or stop["resume_s"] > lease:
        problems.append("shard not resumed within a lease TTL")
    return problems


def _ready(shard: int, paused: float, calls: list[Call], writes: list[Write]) -> float:
    """When the shard had work due after the pause: then, if a write committed before
    was still undelivered; else when the next write committed (never: infinity)."""
    covered: dict[Group, int] = {}
    for c in calls:
        if c.shard == shard and c.ok and c.start < paused:
            covered[c.group] = max(covered.get(c.group, 0), c.seq)
    due = [w.at for w in writes if w.shard == shard and covered.get(w.group, 0) < w.seq]
    return max(paused, min(due)) if due else float("inf")


def summary(stops: list[dict[str, Any]]) -> dict[str, Any]:
    """The table's view: how many stops, worst timings, how many failed a check."""

    def worst(key: str) -> float | None:
        values = [s[key] for s in stops if s[key] is not None]
        return max(values) if values else None

    return {
        "stops": len(stops),
        "failed": sum(1 for s in stops if s["problems"]),
        "max_exit_s": worst("exit_s"),
        "max_resume_s": worst("resume_s"),
        # Stops whose shard resumed while its old lease would still have held it: there,
        # the timing alone shows that the lease was released, not waited out.
        "resumed_within_old_lease": sum(
            1
            for s in stops
            if None not in (s["resume_s"], s["lease_left_s"]) and s["resume_s"] < s["lease_left_s"]
        ),
    }
