"""Relays: each relay drained by the engine against its raw client floor, side by side in
one run, on PostgreSQL.

For each relay (RabbitMQ with publisher confirms, a Redis stream, Kafka on librdkafka's
mock cluster, a webhook endpoint answering after a fixed delay; each in its own module,
`bench.relays_amqp` ...):

- ours: the run's rows (`bench.relays_common`: one message per shard per round, each its
  own object, so nothing coalesces) are loaded into RegionOutbox; the relay, connected
  to their category, publishes one message untimed (its connections made), then one-shot
  `drain_outboxes(concurrency=N)` calls on kept slot threads drain the table, timed to
  empty. The relay counts its `publish` calls: the mean batch it published is the
  batch size of its floor. What the relay published is read back by a consumer:
  messages lost, repeated, unexpected, and shards read out of order;
- its floor: the same messages (the same CloudEvents JSON body and headers, built in
  the loop) published by a hand loop with the client alone, in batches of that mean
  size, confirmed once per batch (`raw` of each relay's module).

Goals (`bench.relays_plans`) are reported, met or missed (`missed_goals`), and never
fail the run; a lost, repeated or out-of-order message, a failed publish or a drain
that did not finish does, in any mode. A relay whose client is not installed or whose
server does not answer is skipped, with the reason.
"""

from __future__ import annotations

import os
import secrets
import statistics
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench import relays_report
from bench.relays_common import (
    CATEGORY,
    drain_to_empty,
    engine_alone,
    raw_messages,
    shape,
    tally,
)
from bench.relays_common import warm_up_message as _warm_up
from bench.relays_plans import BROKER_GOAL, CONCURRENCY, MODES, WEBHOOK_CONCURRENCIES, WEBHOOK_GOAL

TITLE = "Relays (RabbitMQ, Redis Streams, Kafka, webhooks) against their raw clients"
markdown = relays_report.markdown


def _targets() -> list[tuple[str, Callable[[], Any]]]:
    """Each relay's name and how to open its target (its module imported only then)."""

    def amqp() -> Any:
        from bench.relays_amqp import Amqp

        return Amqp()

    def redis() -> Any:
        from bench.relays_redis import RedisStreams

        return RedisStreams()

    def kafka() -> Any:
        from bench.relays_kafka import Kafka

        return Kafka()

    def webhook(concurrency: int) -> Callable[[], Any]:
        def open_target() -> Any:
            from bench.relays_webhook import Webhook

            return Webhook(concurrency)

        return open_target

    brokers = [("amqp", amqp), ("redis", redis), ("kafka", kafka)]
    return brokers + [(f"webhook_c{n}", webhook(n)) for n in WEBHOOK_CONCURRENCIES]


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The section (see the module docstring)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {"skipped": "the section runs on PostgreSQL"}
    sizes = MODES[mode]
    load_start = list(os.getloadavg())
    relays: dict[str, Any] = {}
    problems: list[str] = []
    for kind, open_target in _targets():
        try:
            target = open_target()
        except Exception as exc:  # no client library, no server: that relay is left out
            relays[kind] = {"skipped": f"{type(exc).__name__}: {exc}"}
            log(f"relays {kind}: skipped ({relays[kind]['skipped']})")
            continue
        try:
            relays[kind] = _measure_one(target, sizes, log)
            problems += relays[kind].pop("problems")
        except Exception as exc:
            log(f"relays {kind} failed:\n" + traceback.format_exc())
            relays[kind] = {"skipped": f"failed: {exc}"}
            problems.append(f"relays/{kind}: failed: {exc}")
        finally:
            _close(target, log)
    from bench.db import reset

    reset()
    return {
        "relays": relays,
        "concurrency": CONCURRENCY,
        "webhook_concurrencies": list(WEBHOOK_CONCURRENCIES),
        "rounds": sizes.rounds,
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "problems": problems,
        "missed_goals": [
            f"relays: {r['title']}: {r['ratio']:.2f}, goal {r['goal_text']}"
            for r in relays.values()
            if r.get("met") is False
        ],
    }


def _close(target: Any, log: Callable[[str], None]) -> None:
    """Delete what the relay's run made (a failure here is logged, not fatal: the
    names are the run's own and the queue expires by itself)."""
    try:
        target.close()
    except Exception as exc:
        log(f"relays {target.kind}: cleaning up failed: {exc}")


def _measure_one(target: Any, sizes: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """`sizes.rounds` runs of ours then its floor; the median of each, and the checks
    of every run."""
    webhook = target.kind == "webhook"
    shards, per_shard = sizes.webhook if webhook else sizes.broker
    per_shard = min(per_shard, getattr(target, "max_per_shard", per_shard))  # Kafka's mock
    concurrency = target.concurrency if webhook else CONCURRENCY
    runs = [
        _run(target, shards, per_shard, concurrency, sizes.budget_s) for _ in range(sizes.rounds)
    ]
    for run in runs:
        log(relays_report.progress(target.kind, concurrency, run))
    ours = statistics.median(run["per_s"] for run in runs)
    raw = statistics.median(run["raw_per_s"] for run in runs)
    median_run = min(runs, key=lambda run: abs(run["per_s"] - ours))
    result: dict[str, Any] = {
        **median_run,
        "title": target.title,
        "floor": target.floor,
        "per_s": ours,
        "raw_per_s": raw,
        "runs_per_s": [run["per_s"] for run in runs],
        "raw_runs_per_s": [run["raw_per_s"] for run in runs],
        "engine_alone_per_s": statistics.median(run["engine_alone_per_s"] for run in runs),
        "raw_ratio": ours / raw if raw else None,
        "problems": [f"relays/{target.kind}: {p}" for run in runs for p in run["problems"]],
    }
    if webhook:
        ideal = target.ideal_per_s(shards)
        result.update(target.describe(), ideal_per_s=ideal, ratio=ours / ideal, goal=WEBHOOK_GOAL)
        result["goal_text"] = f"≥ {WEBHOOK_GOAL:.1f} x ideal"
    else:
        result.update(ratio=result["raw_ratio"], goal=BROKER_GOAL)
        result["goal_text"] = f"≥ {BROKER_GOAL:.1f} x raw"
    result["met"] = result["ratio"] is not None and result["ratio"] >= result["goal"]
    return result


def _run(
    target: Any, shards: int, per_shard: int, concurrency: int, budget: float
) -> dict[str, Any]:
    """One run of ours, read back and checked, then its floor at ours' mean batch."""
    from bench.db import load_shape, reset
    from outbox.engine.slots import kept_slots
    from outbox.signals import process_region_outbox

    reset()
    relay = target.relay(f"bench-{target.kind}-{secrets.token_hex(4)}")
    relay.connect(CATEGORY, signals=[process_region_outbox])
    try:
        warm_up = relay.publish([_warm_up()])
        if warm_up:
            raise RuntimeError(f"the warm-up message failed: {next(iter(warm_up.values()))}")
        relay.batches.clear()
        rows = load_shape(shape(shards, per_shard))
        with kept_slots(concurrency) as slots:
            drained = drain_to_empty(concurrency, slots, budget)
    finally:
        relay.disconnect()
    checks = tally(target.read(rows + 1), shards, per_shard)
    target.clear()
    published = sum(relay.batches)
    mean_batch = published / len(relay.batches) if relay.batches else 0.0
    raw_batch = max(round(mean_batch), 1)
    raw_seconds = target.raw(raw_messages(shards, per_shard), raw_batch)
    target.clear()
    alone = engine_alone(shards, per_shard, concurrency, budget)
    run = {
        "messages": rows,
        "shards": shards,
        "per_shard": per_shard,
        "concurrency": concurrency,
        "seconds": drained.seconds,
        "per_s": rows / drained.seconds if drained.complete else 0.0,
        "complete": drained.complete,
        "failures": drained.failures,
        "published": published,
        "publishes": len(relay.batches),
        "mean_batch": mean_batch,
        "max_batch": max(relay.batches, default=0),
        # How many publishes had each size: how the slots' calls fell into batches.
        "batch_sizes": dict(sorted(Counter(relay.batches).items())),
        "raw_batch": raw_batch,
        "raw_seconds": raw_seconds,
        "raw_per_s": rows / raw_seconds if raw_seconds > 0 else 0.0,
        "engine_alone_per_s": alone,
        **checks,
    }
    run["problems"] = _check(run)
    return run


def _check(run: dict[str, Any]) -> list[str]:
    """What went wrong with a run's deliveries (goals aside)."""
    found = [
        f"{run[key]} {what}"
        for key, what in (
            ("lost", "messages never read back"),
            ("duplicates", "messages read back more than once"),
            ("unexpected", "messages read back that were not written"),
            ("order_violations", "shards read back out of order"),
            ("failures", "failed publishes"),
        )
        if run[key]
    ]
    if not run["complete"]:
        found.append(f"the drain did not finish within its budget ({run['seconds']:.0f} s)")
    if run["published"] != run["messages"]:
        found.append(f"{run['published']} messages published for {run['messages']} rows")
    return found
