"""The sustained section's figures, worked out once the run is over from the writers'
commits, the receiver starts (both `time.time()`, joined by message) and the monitor's
samples; and their Markdown."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.sustained_monitor import Monitor, Pin, Stats

# Goals of the issue: clear within 1 s; at 80 %, lag p50 <= 10 ms and p99 <= 100 ms;
# lag back to normal within 10 s after the long transaction ends.
CLEAR_GOAL_S = 1.0
LAG_P50_GOAL_MS = 10.0
LAG_P99_GOAL_MS = 100.0
RECOVERY_GOAL_S = 10.0
# "Normal" lag after the pin: a 1 s window's p99 at most this many times the p99 before
# it, or LAG_P99_GOAL_MS, whichever is larger (a window's p99 is noisy).
NORMAL_FACTOR = 1.5
# The lag figures of a run leave out its first second: the drain loop was idle (asleep
# between polls) when the writers started, which says nothing of the steady state.
WARMUP_S = 1.0


@dataclass
class Run:
    """One writers' run: every commit (message id -> commit time) and its timing."""

    target_per_s: float | None
    seconds: float
    commits: dict[int, float]
    per_writer: list[int]

    @property
    def first(self) -> float:
        return min(self.commits.values())

    @property
    def last(self) -> float:
        return max(self.commits.values())

    def steady(self) -> dict[int, float]:
        """The commits past the run's first WARMUP_S seconds (or first half, if shorter)."""
        after = self.first + min(WARMUP_S, (self.last - self.first) / 2)
        return {message: at for message, at in self.commits.items() if at >= after}

    @property
    def rate(self) -> float:
        return len(self.commits) / self.seconds if self.seconds else 0.0


def summary(run: Run, starts: dict[int, float], monitor: Monitor) -> dict[str, Any]:
    delivered = [starts[message] for message in run.commits if message in starts]
    last_start = max(delivered, default=None)
    return {
        "seconds": run.seconds,
        "messages": len(run.commits),
        "rate_per_s": run.rate,
        "target_per_s": run.target_per_s,
        "per_writer_per_s": [count / run.seconds for count in run.per_writer],
        "backlog_max": max(monitor.backlog_between(run.first, run.last), default=0),
        "backlog_at_stop": _backlog_at(monitor, run.last),
        # Below 0 when the last receiver started before its writer noted the commit
        # return: nothing was left when the writers stopped.
        "clear_s": max(0.0, last_start - run.last) if last_start is not None else None,
        **_lag(run.steady(), starts),
    }


def _lag(commits: dict[int, float], starts: dict[int, float]) -> dict[str, float | None]:
    lags = sorted(
        (starts[message] - at) * 1000 for message, at in commits.items() if message in starts
    )
    if not lags:
        return {"lag_p50_ms": None, "lag_p90_ms": None, "lag_p99_ms": None, "lag_max_ms": None}
    return {
        "lag_p50_ms": statistics.median(lags),
        "lag_p90_ms": _percentile(lags, 0.90),
        "lag_p99_ms": _percentile(lags, 0.99),
        "lag_max_ms": lags[-1],
    }


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def _backlog_at(monitor: Monitor, moment: float) -> int | None:
    before = [count for at, count in monitor.backlog if at <= moment]
    return before[-1] if before else None


def pinned(
    run: Run, pin: Pin, starts: dict[int, float], monitor: Monitor, hold_s: float
) -> dict[str, Any]:
    """Before, during and after the long transaction; when the lag is normal again."""
    if pin.pinned_at is None or pin.released_at is None:
        return {"hold_s": hold_s, "failed": pin.failure or "the transaction never opened"}
    bounds = {
        "before": (run.first + min(WARMUP_S, (pin.pinned_at - run.first) / 2), pin.pinned_at),
        "during": (pin.pinned_at, pin.released_at),
        "after": (pin.released_at, run.last),
    }
    windows = {name: _window(run, starts, monitor, *span) for name, span in bounds.items()}
    before_p99 = windows["before"]["lag_p99_ms"] or 0.0
    normal_ms = max(NORMAL_FACTOR * before_p99, LAG_P99_GOAL_MS)
    series = _series(run, starts, monitor, pin.pinned_at)
    recovery = _recovery(series, pin.released_at - pin.pinned_at, normal_ms)
    return {
        "hold_s": pin.released_at - pin.pinned_at,
        "target_per_s": run.target_per_s,
        "windows": windows,
        "lag_normal_ms": normal_ms,
        "recovery_s": recovery,
        "series": series,
    }


def _window(
    run: Run, starts: dict[int, float], monitor: Monitor, start: float, end: float
) -> dict[str, Any]:
    seconds = max(end - start, 1e-9)
    committed = {message: at for message, at in run.commits.items() if start <= at < end}
    delivered = sum(1 for message in run.commits if start <= starts.get(message, -1.0) < end)
    first, last = monitor.stats_at(start), monitor.stats_at(end)
    return {
        "seconds": end - start,
        "write_per_s": len(committed) / seconds,
        "drain_per_s": delivered / seconds,
        **_lag(committed, starts),
        "backlog_max": max(monitor.backlog_between(start, end), default=0),
        **_table_figures(last),
        "outbox_dead_max": max(
            (s.outbox_dead for s in monitor.stats if start <= s.at <= end), default=None
        ),
        "drain_cpu_ms_per_message": _cpu_per_message(first, last, delivered),
        "drain_db_cpu_ms_per_message": _db_cpu_per_message(first, last, delivered),
    }


def _table_figures(stats: Stats | None) -> dict[str, int | None]:
    """Dead tuples and total size (with indexes) of both tables, at a window's end."""
    if stats is None:
        return {"outbox_dead": None, "outbox_kb": None, "lease_dead": None, "lease_kb": None}
    return {
        "outbox_dead": stats.outbox_dead,
        "outbox_kb": stats.outbox_bytes // 1024,
        "lease_dead": stats.lease_dead,
        "lease_kb": stats.lease_bytes // 1024,
    }


def _spans(first: Stats | None, last: Stats | None, delivered: int) -> bool:
    """Whether two stats samples (1 s apart at best) span deliveries to divide by."""
    return first is not None and last is not None and last.at > first.at and delivered > 0


def _cpu_per_message(first: Stats | None, last: Stats | None, delivered: int) -> float | None:
    if not _spans(first, last, delivered):
        return None
    assert first is not None and last is not None
    if first.drain_cpu_s is None or last.drain_cpu_s is None:
        return None
    return (last.drain_cpu_s - first.drain_cpu_s) * 1000 / delivered


def _db_cpu_per_message(first: Stats | None, last: Stats | None, delivered: int) -> float | None:
    """CPU time of the drain's database backends per delivered message (a backend that
    appeared in between counts from 0)."""
    if not _spans(first, last, delivered):
        return None
    assert first is not None and last is not None
    if not last.drain_db_cpu_s:
        return None
    spent = sum(
        cpu - first.drain_db_cpu_s.get(pid, 0.0) for pid, cpu in last.drain_db_cpu_s.items()
    )
    return spent * 1000 / delivered


SERIES_COLUMNS = [
    "t_s",
    "commits",
    "deliveries",
    "lag_p50_ms",
    "lag_p99_ms",
    "backlog_max",
    "outbox_dead",
    "outbox_kb",
]


def _series(run: Run, starts: dict[int, float], monitor: Monitor, origin: float) -> dict[str, Any]:
    """Per-second figures of the pinned run, `t_s` counted from the pin (by commit time
    for the lag, by start time for deliveries)."""
    committed: dict[int, dict[int, float]] = {}
    delivered: Counter[int] = Counter()
    for message, at in run.commits.items():
        committed.setdefault(math.floor(at - origin), {})[message] = at
        if message in starts:
            delivered[math.floor(starts[message] - origin)] += 1
    rows = []
    for second in range(math.floor(run.first - origin), math.floor(run.last - origin) + 1):
        start, end = origin + second, origin + second + 1
        lag = _lag(committed.get(second, {}), starts)
        stats = monitor.stats_at(end)
        rows.append(
            [
                second,
                len(committed.get(second, {})),
                delivered[second],
                _round(lag["lag_p50_ms"]),
                _round(lag["lag_p99_ms"]),
                max(monitor.backlog_between(start, end), default=None),
                stats.outbox_dead if stats else None,
                stats.outbox_bytes // 1024 if stats else None,
            ]
        )
    return {"columns": SERIES_COLUMNS, "rows": rows}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _recovery(series: dict[str, Any], released_s: float, normal_ms: float) -> float | None:
    """Seconds from the end of the long transaction to the end of the last 1 s window
    whose p99 lag is above normal (0 when none is); None when the last one still is."""
    p99 = SERIES_COLUMNS.index("lag_p99_ms")
    after = [row for row in series["rows"] if row[0] + 1 > released_s and row[p99] is not None]
    if not after:
        return None
    late: list[int] = [row[0] + 1 for row in after if row[p99] > normal_ms]
    if not late:
        return 0.0
    if late[-1] == after[-1][0] + 1:
        return None
    return max(0.0, late[-1] - released_s)


def goals(result: dict[str, Any]) -> dict[str, bool | None]:
    def at_most(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    recovery = result["pinned"].get("recovery_s")
    return {
        "clear_within_1s": at_most(result["clear_s"], CLEAR_GOAL_S),
        "lag_p50_within_10ms": at_most(result["lag_p50_ms"], LAG_P50_GOAL_MS),
        "lag_p99_within_100ms": at_most(result["lag_p99_ms"], LAG_P99_GOAL_MS),
        "lag_normal_within_10s": False
        if "windows" in result["pinned"] and recovery is None
        else at_most(recovery, RECOVERY_GOAL_S),
    }


def markdown(result: dict[str, Any]) -> list[str]:
    server = result["server"]
    lines = [
        f"{result['writers']} writer processes (one message per transaction, one per shard "
        f"over {result['shards']:,} shards) and one `drain_outboxes --loop` (loop interval "
        f"{result['loop_interval_s']:g} s) at once. Lag: the receiver's start minus the "
        f"writer's commit return, leaving out each run's first {WARMUP_S:g} s. Clear: the "
        "writers' last commit to the receiver start of the last message. Server autovacuum "
        f"`{server.get('autovacuum')}` (naptime {server.get('autovacuum_naptime')} s)"
        + _stand_in(result)
        + ".",
        "",
        "| run | writers | backlog max | clear | lag p50 | lag p99 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    titles = {"full_speed": "full speed", "at_80": "80 %", "pinned": "80 %, horizon pinned"}
    for name, title in titles.items():
        phase = result["phases"][name]
        lines.append(
            f"| {title} ({phase['seconds']:.0f} s) | {phase['rate_per_s']:,.0f} msg/s "
            f"| {phase['backlog_max']:,} rows | {_fmt(phase['clear_s'], '{:.2f} s')} "
            f"| {_fmt(phase['lag_p50_ms'], '{:.1f} ms')} "
            f"| {_fmt(phase['lag_p99_ms'], '{:.0f} ms')} |"
        )
    pinned = result["pinned"]
    if "windows" in pinned:
        lines += _pinned_markdown(pinned)
    elif pinned.get("failed"):
        lines += ["", f"Pinned horizon: failed ({pinned['failed']})."]
    goals = result.get("goals", {})
    met = {True: "met", False: "**not met**", None: "n/a"}
    lines += [
        "",
        "Goals: "
        + "; ".join(f"{name.replace('_', ' ')}: {met[value]}" for name, value in goals.items())
        + ".",
    ]
    return lines


PINNED_ROWS = [
    ("writers (msg/s)", "write_per_s", "{:,.0f}"),
    ("drain (msg/s)", "drain_per_s", "{:,.0f}"),
    ("lag p50 (ms)", "lag_p50_ms", "{:.1f}"),
    ("lag p99 (ms)", "lag_p99_ms", "{:.0f}"),
    ("backlog max (rows)", "backlog_max", "{:,}"),
    ("outbox dead tuples, at the end", "outbox_dead", "{:,}"),
    ("outbox table + indexes (kB), at the end", "outbox_kb", "{:,}"),
    ("lease dead tuples, at the end", "lease_dead", "{:,}"),
    ("lease table + indexes (kB), at the end", "lease_kb", "{:,}"),
    ("drain process CPU per message (ms)", "drain_cpu_ms_per_message", "{:.2f}"),
    ("drain's database backend CPU per message (ms)", "drain_db_cpu_ms_per_message", "{:.2f}"),
]


def _pinned_markdown(pinned: dict[str, Any]) -> list[str]:
    windows = pinned["windows"]
    lines = [
        "",
        f"A REPEATABLE READ transaction held {pinned['hold_s']:.0f} s in the 80 % run, "
        "which starts from vacuumed tables (windows by commit time for the lag, by "
        "receiver start for the drain rate):",
        "",
        "| | before | during | after |",
        "|---|---:|---:|---:|",
    ]
    for title, key, form in PINNED_ROWS:
        cells = " | ".join(_fmt(windows[name][key], form) for name in windows)
        lines.append(f"| {title} | {cells} |")
    recovery = pinned["recovery_s"]
    back = "not within the run" if recovery is None else f"{recovery:.1f} s after it ended"
    lines += [
        "",
        f"Lag back to normal (every later second's p99 <= {pinned['lag_normal_ms']:.0f} ms): "
        f"{back}.",
    ]
    vacuum = pinned.get("vacuum")
    if vacuum:
        lines.append(
            f"A plain VACUUM of both tables after the run took {vacuum['seconds'] * 1000:.0f} ms "
            f"and left {_fmt(vacuum['outbox_dead'], '{:,}')} dead tuples in "
            f"{_fmt(vacuum['outbox_kb'], '{:,}')} kB (outbox) and "
            f"{_fmt(vacuum['lease_dead'], '{:,}')} in {_fmt(vacuum['lease_kb'], '{:,}')} kB "
            "(leases)."
        )
    return lines


def _stand_in(result: dict[str, Any]) -> str:
    every = result.get("vacuum_stand_in_every_s")
    if not every:
        return ""
    longest = result.get("vacuum_stand_in_max_s")
    if longest is None:
        return f"; the bench would have vacuumed both tables itself every {every:g} s instead"
    return (
        f"; the bench vacuumed both tables itself every {every:g} s instead "
        f"({result['vacuum_stand_in_runs']} runs, the longest "
        f"{_fmt(longest and longest * 1000, '{:.0f}')} ms)"
    )


def _fmt(value: Any, form: str) -> str:
    return "-" if value is None else form.format(value)
