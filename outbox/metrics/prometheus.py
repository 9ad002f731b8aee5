"""Prometheus adapter (`OUTBOX_METRICS = "prometheus"`), on `prometheus_client`.

The instruments are registered once per registry (the default `REGISTRY` unless one is
given): `outbox_saved_total`, `outbox_processed_total`, `outbox_failed_total`,
`outbox_dead_lettered_total`, `outbox_leases_lost_total`, the histograms
`outbox_processing_lag_seconds`, `outbox_send_duration_seconds`,
`outbox_receiver_duration_seconds` and `outbox_claim_duration_seconds`, and the gauges
`outbox_backlog_rows`, `outbox_backlog_shards`, `outbox_stuck_receivers`, the health
gauges `outbox_oldest_due_age_seconds`, `outbox_due_rows`, `outbox_due_shards`,
`outbox_failing_shards`, `outbox_dead_letters`, `outbox_expired_leases`,
`outbox_paused_parts`, and
`outbox_gauges_read_timestamp_seconds` (when they were last read, per table).

On PostgreSQL the readings add the vacuum gauges `outbox_oldest_xmin_age_seconds` and
`outbox_oldest_xmin_xid_age` (per database) and `outbox_dead_tuples` (per table and
database).

Multiprocess mode (gunicorn workers, Celery pool processes): set the environment
variable ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the processes start;
`prometheus_client` then keeps every process's values in files there, and the process
serving ``/metrics`` exposes them with `multiprocess_registry()` (or
`prometheus_client.multiprocess.MultiProcessCollector`). Every gauge is a live one: the
backlog, health and vacuum gauges show the most recent reading of a live process
(``livemostrecent``; `outbox.metrics.refresh` has one process per directory read them),
the stuck receivers gauge sums the live processes' counts (``livesum``). A process's live
gauges go when its files are marked dead (`mark_process_dead`): `drain_outboxes` and
Celery pool processes do it as they end (`PrometheusMetrics.process_ended`), gunicorn's
``child_exit`` hook does it for a web worker, and `multiprocess_registry()` does it, at
each scrape, for every process of the directory that no longer runs on this host (a
``kill -9``, an out-of-memory kill) and for every drain process whose beat expired (it
runs but stopped beating: no longer listed alive, see `outbox.health.beacon`). Counters
and histograms keep a dead process's counts, as they should.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import weakref
from collections.abc import Iterable
from typing import Literal

from django.db import connections
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from outbox.health.beacon import expired_beats, remove_beat
from outbox.metrics.backlog import record_backlog
from outbox.metrics.base import Metrics, ScopeHealth

__all__ = [
    "PrometheusMetrics",
    "PrometheusScrapeMetrics",
    "mark_process_dead",
    "multiprocess_registry",
    "sweep_dead_processes",
]

logger = logging.getLogger(__name__)

MESSAGE_LABELS = ("table", "scope", "category")
SCOPE_LABELS = ("table", "scope")
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# ScopeHealth's fields, each a gauge of the same name.
HEALTH_GAUGES = (
    ("oldest_due_age_seconds", "Age of the oldest due outbox row, per scope."),
    ("due_rows", "Outbox rows due for delivery, per scope."),
    ("due_shards", "Outbox shards with rows due, per scope."),
    ("failing_shards", "Outbox shards whose row failed and waits for a retry."),
    ("dead_letters", "Outbox messages given up (dead letters), per scope."),
    ("expired_leases", "Outbox shards whose worker's lease ran out, per scope."),
    ("paused_parts", "Paused outbox parts (the scope, its shards, categories), per scope."),
)
# How a gauge combines the processes' values in multiprocess mode (see the module docstring).
_Mode = Literal["livemostrecent", "livesum"]
# A live gauge's file in the multiprocess directory, named for its process.
_LIVE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")


class _Instruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: Iterable[str] = MESSAGE_LABELS) -> Counter:
            return Counter(f"outbox_{name}", doc, labels, registry=registry)

        def gauge(
            name: str,
            doc: str,
            labels: Iterable[str] = SCOPE_LABELS,
            mode: _Mode = "livemostrecent",
        ) -> Gauge:
            return Gauge(f"outbox_{name}", doc, labels, registry=registry, multiprocess_mode=mode)

        self.saved = counter("saved", "Outbox rows saved.")
        self.processed = counter("processed", "Outbox rows retired by a delivery.")
        self.failed = counter("failed", "Failed deliveries of outbox messages.")
        self.dead_lettered = counter("dead_lettered", "Outbox messages dead-lettered.")
        self.leases_lost = counter("leases_lost", "Shard leases lost.", SCOPE_LABELS)
        self.lag = Histogram(
            "outbox_processing_lag_seconds",
            "Age of the delivered outbox row when its receivers ran.",
            MESSAGE_LABELS,
            registry=registry,
            buckets=LAG_BUCKETS,
        )
        self.duration = Histogram(
            "outbox_send_duration_seconds",
            "Time the receivers of one outbox message took.",
            MESSAGE_LABELS,
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.receiver_duration = Histogram(
            "outbox_receiver_duration_seconds",
            "Time one receiver took for one outbox message.",
            (*MESSAGE_LABELS, "receiver"),
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.claim_duration = Histogram(
            "outbox_claim_duration_seconds",
            "Time one claim of due shards took.",
            ("table",),
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.backlog_rows = gauge("backlog_rows", "Outbox rows waiting, per scope.")
        self.backlog_shards = gauge("backlog_shards", "Outbox shards with rows waiting.")
        self.stuck_receivers = gauge(
            "stuck_receivers", "Receiver threads stuck past the timeout.", ("table",), "livesum"
        )
        self.health = {name: gauge(name, doc) for name, doc in HEALTH_GAUGES}  # ScopeHealth
        self.read_at = gauge("gauges_read_timestamp_seconds", "When gauges were read.", ("table",))
        self.xmin_age = gauge(
            "oldest_xmin_age_seconds",
            "Age of the oldest transaction vacuum must respect (PostgreSQL), per database.",
            ("database",),
        )
        self.xmin_xid_age = gauge(
            "oldest_xmin_xid_age",
            "Transaction ids since the oldest one vacuum must respect (PostgreSQL).",
            ("database",),
        )
        self.dead_tuples = gauge(
            "dead_tuples", "Dead tuples not yet vacuumed (PostgreSQL).", ("table", "database")
        )


# Instruments by registry: a registry refuses a second instrument of the same name.
_registered: weakref.WeakKeyDictionary[CollectorRegistry, _Instruments] = (
    weakref.WeakKeyDictionary()
)


class PrometheusMetrics(Metrics):
    """Records into `registry` (default: `prometheus_client.REGISTRY`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        if self.registry not in _registered:
            _registered[self.registry] = _Instruments(self.registry)
        self.instruments = _registered[self.registry]

    def saved(self, table: str, scope: str, category: str, count: int) -> None:
        self.instruments.saved.labels(table, scope, category).inc(count)

    def processed(
        self,
        table: str,
        scope: str,
        category: str,
        rows: int,
        lag_seconds: float | None,
        duration_seconds: float,
    ) -> None:
        self.instruments.processed.labels(table, scope, category).inc(rows)
        if lag_seconds is not None:
            self.instruments.lag.labels(table, scope, category).observe(max(lag_seconds, 0.0))
        self.instruments.duration.labels(table, scope, category).observe(duration_seconds)

    def failed(self, table: str, scope: str, category: str) -> None:
        self.instruments.failed.labels(table, scope, category).inc()

    def dead_lettered(self, table: str, scope: str, category: str) -> None:
        self.instruments.dead_lettered.labels(table, scope, category).inc()

    def lease_lost(self, table: str, scope: str) -> None:
        self.instruments.leases_lost.labels(table, scope).inc()

    def backlog(self, table: str, scope: str, rows: int, shards: int) -> None:
        self.instruments.backlog_rows.labels(table, scope).set(rows)
        self.instruments.backlog_shards.labels(table, scope).set(shards)

    def health(self, table: str, scope: str, health: ScopeHealth) -> None:
        for name, gauge in self.instruments.health.items():
            gauge.labels(table, scope).set(getattr(health, name))

    def gauges_read(self, table: str, timestamp: float) -> None:
        self.instruments.read_at.labels(table).set(timestamp)

    def receiver_finished(
        self, table: str, scope: str, category: str, receiver: str, duration_seconds: float
    ) -> None:
        histogram = self.instruments.receiver_duration
        histogram.labels(table, scope, category, receiver).observe(duration_seconds)

    def claimed(self, table: str, shards: int, duration_seconds: float) -> None:
        self.instruments.claim_duration.labels(table).observe(duration_seconds)

    def stuck_receivers(self, table: str, count: int) -> None:
        self.instruments.stuck_receivers.labels(table).set(count)

    def xmin_horizon(self, database: str, age_seconds: float | None, xid_age: int) -> None:
        # NaN where the age is not shown: no stale value, and no comparison holds on it.
        seconds = math.nan if age_seconds is None else age_seconds
        self.instruments.xmin_age.labels(database).set(seconds)
        self.instruments.xmin_xid_age.labels(database).set(xid_age)

    def dead_tuples(self, table: str, database: str, count: int) -> None:
        self.instruments.dead_tuples.labels(table, database).set(count)

    def process_ended(self) -> None:
        mark_process_dead(os.getpid())


class PrometheusScrapeMetrics(PrometheusMetrics):
    """`PrometheusMetrics` that also reads the backlog on every scrape of its registry.

    Choose it with ``OUTBOX_METRICS = "outbox.metrics.prometheus.PrometheusScrapeMetrics"``.
    Each scrape then runs one aggregate query per outbox table, in the scraping thread;
    a connection opened for it is closed again."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        fresh = registry not in _registered
        if fresh:  # refresh first: the registry collects in registration order
            registry.register(_BacklogOnScrape(self))
        super().__init__(registry)
        if not fresh:
            logger.warning("The outbox backlog is not read on scrape: instruments existed.")


class _BacklogOnScrape(Collector):
    """Collects nothing itself: updates the backlog gauges, collected right after it."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # no names of its own, and no query when it is registered

    def collect(self) -> Iterable[Metric]:
        idle = {alias for alias in connections if connections[alias].connection is None}
        try:
            record_backlog(metrics=self.metrics)
        except Exception:
            logger.exception("Reading the outbox backlog for a scrape failed")
        finally:
            for alias in idle:  # opened here: a scrape thread may never come back
                if not connections[alias].in_atomic_block:
                    connections[alias].close()
        return []


def mark_process_dead(pid: int, path: str | None = None) -> None:
    """Remove process `pid`'s live gauge files from the multiprocess directory `path`
    (default: PROMETHEUS_MULTIPROC_DIR; nothing happens when neither is set): its gauges
    are no longer shown. Its counters and histograms stay counted."""
    path = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def sweep_dead_processes(path: str) -> list[int]:
    """Mark dead every process with live gauge files in `path` that no longer runs on
    this host, and every drain process whose beat there expired; the ids of those marked.

    The directory is this host's (prometheus_client's files are memory-mapped), so a
    process id that does not run here belongs to a process that ended without marking
    itself dead: killed, or never told. A drain's beacon (`outbox.health.beacon`) keeps
    a beat file there that expires with its drain record: a drain that stopped beating
    (frozen, wedged as a whole) is no longer listed alive, and its gauges go too."""
    gone = set(expired_beats(path))
    for name in glob.glob(os.path.join(glob.escape(path), "gauge_live*_*.db")):
        match = _LIVE_FILE.fullmatch(os.path.basename(name))
        if match and not _running(int(match.group(1))):
            gone.add(int(match.group(1)))
    for pid in sorted(gone):
        mark_process_dead(pid, path)
        remove_beat(path, pid)
        logger.info(
            "Prometheus gauges of ended process %s withdrawn",
            pid,
            extra={"event": "outbox.metrics_process_gone", "pid": pid},
        )
    return sorted(gone)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def multiprocess_registry(path: str | None = None) -> CollectorRegistry:
    """A registry of every process writing to the multiprocess directory `path` (default:
    PROMETHEUS_MULTIPROC_DIR): what a process serving ``/metrics`` for them exposes.
    Each collection first withdraws the live gauges of processes that no longer run
    (`sweep_dead_processes`). Raises ValueError when `path` is no directory."""
    path = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR") or ""
    registry = CollectorRegistry()
    sweep = _SweepDeadProcesses(path)
    registry.register(sweep)  # first: the registry collects in registration order
    try:
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    except ValueError:
        registry.unregister(sweep)
        raise
    return registry


class _SweepDeadProcesses(Collector):
    """Collects nothing itself: withdraws ended processes' live gauges just before the
    multiprocess collector, registered after it, reads the directory."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        try:
            sweep_dead_processes(self.path)
        except OSError:
            logger.exception("Withdrawing the gauges of ended processes failed")
        return []
