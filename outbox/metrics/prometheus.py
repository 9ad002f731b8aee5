"""Prometheus adapter (`OUTBOX_METRICS = "prometheus"`), on `prometheus_client`.

The instruments are registered once per registry (the default `REGISTRY` unless one is
given): `outbox_saved_total`, `outbox_processed_total`, `outbox_failed_total`,
`outbox_dead_lettered_total`, `outbox_leases_lost_total`, the histograms
`outbox_processing_lag_seconds`, `outbox_send_duration_seconds`,
`outbox_receiver_duration_seconds` and `outbox_claim_duration_seconds`, and the gauges
`outbox_backlog_rows`, `outbox_backlog_shards`, `outbox_stuck_receivers`, the health
gauges `outbox_oldest_due_age_seconds`, `outbox_due_rows`, `outbox_due_shards`,
`outbox_failing_shards`, `outbox_dead_letters`, `outbox_expired_leases`, and
`outbox_gauges_read_timestamp_seconds` (when they were last read, per table).

Multiprocess mode (gunicorn workers, Celery pool processes): set the environment
variable ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the processes start;
`prometheus_client` then keeps every process's values in files there, and the process
serving ``/metrics`` exposes them with `prometheus_client.multiprocess.MultiProcessCollector`.
The backlog and health gauges show the most recent reading of any process
(``mostrecent``; `outbox.metrics.refresh` has one process per directory read them); the
stuck receivers gauge sums the live processes' counts (``livesum``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Literal

from django.db import connections
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from outbox.metrics.backlog import record_backlog
from outbox.metrics.base import Metrics, ScopeHealth

__all__ = ["PrometheusMetrics", "PrometheusScrapeMetrics"]

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
)
# How a gauge combines the processes' values in multiprocess mode (see the module docstring).
_Mode = Literal["mostrecent", "livesum"]


class _Instruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: Iterable[str] = MESSAGE_LABELS) -> Counter:
            return Counter(f"outbox_{name}", doc, labels, registry=registry)

        def gauge(
            name: str, doc: str, labels: Iterable[str] = SCOPE_LABELS, mode: _Mode = "mostrecent"
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
