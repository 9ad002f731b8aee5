"""The shapes of the "Receivers that wait" section (`bench.waiting`): their rows, the
worker functions that drain them, and the checks of what the receivers saw.

Row `g` of a shape goes to shard `g % shards + 1` (writes interleaved across shards, as
in `bench.shapes`) at position `g // shards` of that shard; every row is its own object
(nothing coalesces), so each message is one receiver call. The payload tells the
receiver how long to wait (`bench.waiting_receivers`).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.outboxes import BenchCategory, BenchScope

HUNG_SHARD = 1  # the shard whose first message hangs, in the first claim


@dataclass(frozen=True)
class Plan:
    """One shape: `shards` x `per_shard` messages, each call waiting `wait_s`, drained at
    `concurrency` by `processes` one-shot drains (or by procrastinate's worker)."""

    name: str
    title: str
    shards: int
    per_shard: int
    wait_s: float
    concurrency: int
    processes: int = 1
    asynchronous: bool = False
    hang_s: float = 0.0  # the first message of HUNG_SHARD hangs this long
    timeout_s: float | None = None  # OUTBOX_RECEIVER_TIMEOUT_SECONDS for the drain
    goal: float | None = None  # at least this fraction of the ideal rate
    procrastinate: bool = False  # jobs of procrastinate's worker instead of outbox rows
    default_concurrency: bool = False  # the drain is given no concurrency (its default)

    @property
    def rows(self) -> int:
        return self.shards * self.per_shard

    @property
    def ideal_per_s(self) -> float:
        """Every slot busy all the time: min(shards, slots) calls per wait (procrastinate
        has no shards: min(jobs, concurrency))."""
        units = self.rows if self.procrastinate else self.shards
        return min(units, self.concurrency * self.processes) / self.wait_s

    @property
    def category(self) -> BenchCategory:
        return BenchCategory.WAIT_ASYNC if self.asynchronous else BenchCategory.WAIT_SYNC

    def messages(self) -> Iterator[dict[str, Any]]:
        """The messages in id order, as receiver keyword arguments."""
        for g in range(self.rows):
            shard, seq = g % self.shards + 1, g // self.shards
            payload: dict[str, Any] = {"seq": seq, "sleep": self.wait_s}
            if self.hang_s and shard == HUNG_SHARD and seq == 0:
                payload = {"seq": seq, "hang": self.hang_s}
            yield {
                "shard_scope": int(BenchScope.WAIT),
                "shard_identifier": shard,
                "object_identifier": (shard - 1) * self.per_shard + seq + 1,
                "payload": payload,
            }

    def describe(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "messages": self.rows,
            "shards": self.shards,
            "per_shard": self.per_shard,
            "wait_ms": self.wait_s * 1000,
            "receiver": "async def" if self.asynchronous else "sync",
            "concurrency": self.concurrency,
            "processes": self.processes,
            "ideal_per_s": self.ideal_per_s,
            "goal": self.goal,
        }


def load(plan: Plan) -> int:
    """Empty the tables, then write the plan's messages as outbox rows (one statement)
    or as procrastinate jobs; return how many."""
    from bench.db import analyze, reset

    reset()
    if plan.procrastinate:
        from bench import tasks
        from bench.contenders.procrastinate_jobs import defer_messages

        loaded = defer_messages(tasks.wait, plan.messages())
    else:
        loaded = _insert(plan)
    analyze()
    return loaded


def _insert(plan: Plan) -> int:
    from django.db import connection

    from bench.db import LOADED_COLUMNS, _defaults
    from outbox.models import RegionOutbox

    messages = list(plan.messages())
    extra = _defaults(RegionOutbox, set(LOADED_COLUMNS))
    quote = connection.ops.quote_name
    columns = ", ".join(map(quote, [*LOADED_COLUMNS, *extra]))
    values = ", ".join(f"%({name})s" for name in extra)
    statement = (
        f"INSERT INTO {quote(RegionOutbox._meta.db_table)} ({columns}) "
        f"SELECT %(scope)s, m.shard, %(category)s, m.obj, m.payload::jsonb"
        f"{', ' if extra else ''}{values} "
        "FROM unnest(%(shards)s::bigint[], %(objects)s::bigint[], %(payloads)s::text[]) "
        "WITH ORDINALITY AS m(shard, obj, payload, n) ORDER BY m.n"
    )
    params = {
        "scope": int(BenchScope.WAIT),
        "category": int(plan.category),
        "shards": [m["shard_identifier"] for m in messages],
        "objects": [m["object_identifier"] for m in messages],
        "payloads": [json.dumps(m["payload"]) for m in messages],
        **extra,
    }
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


def left(plan: Plan) -> int:
    """Messages not retired: outbox rows, or procrastinate jobs of any status."""
    from bench.db import outbox_rows

    if plan.procrastinate:
        from bench.contenders.procrastinate_jobs import remaining_jobs

        return sum(remaining_jobs().values())
    return outbox_rows()


# -- in the worker processes (`bench.workers.run_processes`) ------------------------------


def drain(budget: float, concurrency: int | None, timeout: float | None = None) -> dict[str, Any]:
    """One `drain_outboxes()` of RegionOutbox at `concurrency` (None: its default;
    one-shot: it returns once nothing it can claim is due), with the receiver timeout
    set to `timeout` if given."""
    from django.test.utils import override_settings

    from bench import waiting_receivers
    from outbox.engine import drain_outboxes
    from outbox.models import RegionOutbox

    overrides = {} if timeout is None else {"OUTBOX_RECEIVER_TIMEOUT_SECONDS": timeout}
    deadline = time.monotonic() + budget
    with override_settings(**overrides):
        started = time.perf_counter()
        stats = drain_outboxes([RegionOutbox], concurrency=concurrency, deadline=deadline)
        finished = time.perf_counter()
    records = waiting_receivers.take_records()
    waiting_receivers.hang_released.set()  # a hung call given up ends now, not later
    return {
        "records": records,
        "drain_started": started,
        "drain_finished": finished,
        "shards_claimed": stats.shards,
        "engine_receiver_calls": stats.receiver_calls,
        "failures": stats.failures,
        "complete": time.monotonic() < deadline,
    }


def procrastinate(budget: float, concurrency: int) -> dict[str, Any]:
    """procrastinate's worker at `concurrency` on the section's queue until it is empty."""
    from bench import tasks, waiting_receivers
    from bench.contenders.procrastinate_jobs import work

    started = time.perf_counter()
    complete = work(budget, tasks.WAIT_QUEUE, concurrency)
    finished = time.perf_counter()
    return {
        "records": waiting_receivers.take_records(),
        "drain_started": started,
        "drain_finished": finished,
        "complete": complete,
    }


# -- checks ---------------------------------------------------------------------------------


def tally(plan: Plan, records: list[list[Any]], started: float) -> dict[str, Any]:
    """Lost and duplicate calls per (shard, object), shards whose calls ran out of
    order or overlapped, and when the last call of a shard other than the hung one returned (seconds
    from `started`, the first drain's start). The hung shard's messages are not owed:
    its first call is given up, the rest wait behind it."""
    calls = Counter((shard, obj) for shard, obj, *_ in records)
    hung = (HUNG_SHARD, 1) if plan.hang_s else None  # the first message of HUNG_SHARD
    owed = {
        (m["shard_identifier"], m["object_identifier"])
        for m in plan.messages()
        if not (hung and m["shard_identifier"] == HUNG_SHARD)
    }
    by_shard: dict[int, list[tuple[float, int, float | None]]] = defaultdict(list)
    for shard, _, seq, call_started, finished in records:
        by_shard[shard].append((call_started, seq, finished))
    ordered = [sorted(calls_of) for calls_of in by_shard.values()]
    out_of_order = sum(1 for run in ordered if [c[1] for c in run] != sorted(c[1] for c in run))
    returned = [r[4] for r in records if r[4] is not None and (r[0], r[1]) in owed]
    return {
        "calls": len(records),
        "lost": sum(1 for key in owed if not calls[key]),
        "duplicates": sum(count - 1 for key, count in calls.items() if count > 1 and key != hung),
        "unexpected": sum(1 for key in calls if key not in owed and key != hung),
        "out_of_order_shards": out_of_order,
        "overlapping_shards": sum(1 for run in ordered if _overlaps(run)),
        "last_other_return_s": max(returned) - started if returned else None,
        **({"hung_calls": calls[hung]} if hung else {}),
    }


def _overlaps(calls: list[tuple[float, int, float | None]]) -> bool:
    """Whether a call of the shard started before the one before it returned (one
    shard is one call at a time); `calls` are in start order."""
    return any(
        previous[2] is None or previous[2] > current[0]
        for previous, current in itertools.pairwise(calls)
    )


class SettleWatch:
    """Polls, on a connection of its own, until no row is left outside the hung shard:
    when the other shards were settled (their rows deleted), `time.perf_counter()`."""

    POLL_SECONDS = 0.01

    def __init__(self) -> None:
        self.settled_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="waiting-settle", daemon=True)

    def __enter__(self) -> SettleWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        import psycopg

        from bench.db import conninfo
        from outbox.models import RegionOutbox

        statement = (
            f'SELECT count(*) FROM "{RegionOutbox._meta.db_table}" '
            "WHERE NOT (shard_scope = %s AND shard_identifier = %s)"
        )
        with psycopg.connect(**conninfo(), autocommit=True) as conn:
            while not self._stop.wait(self.POLL_SECONDS):
                row = conn.execute(statement, [int(BenchScope.WAIT), HUNG_SHARD]).fetchone()
                if row is not None and row[0] == 0:
                    self.settled_at = time.perf_counter()
                    return
