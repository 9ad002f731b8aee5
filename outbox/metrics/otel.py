"""OpenTelemetry adapter (`OUTBOX_METRICS = "opentelemetry"`), on `opentelemetry-api`.

Instruments come from the meter ``outbox`` of the global meter provider, which the
project sets up with the SDK and its exporter (e.g. OTLP): counters ``outbox.saved``,
``outbox.processed``, ``outbox.failed``, ``outbox.dead_lettered``,
``outbox.leases_lost``, histograms ``outbox.processing_lag``, ``outbox.send_duration``,
``outbox.receiver_duration`` and ``outbox.claim_duration`` (seconds) and gauges
``outbox.backlog.rows``, ``outbox.backlog.shards``, ``outbox.stuck_receivers`` (this
process's count), the health gauges ``outbox.oldest_due_age`` (seconds),
``outbox.due_rows``, ``outbox.due_shards``, ``outbox.failing_shards``,
``outbox.dead_letters``, ``outbox.expired_leases``, ``outbox.paused_parts`` and
``outbox.gauges_read_timestamp`` (Unix seconds), on PostgreSQL the vacuum gauges
``outbox.oldest_xmin_age`` (seconds, not recorded where PostgreSQL does not show it),
``outbox.oldest_xmin_xid_age`` and
``outbox.dead_tuples``, with the attributes ``outbox.table``, ``outbox.scope``,
``outbox.category``, ``outbox.receiver`` and ``outbox.database``.
"""

from __future__ import annotations

from dataclasses import asdict

from opentelemetry import metrics as otel

from outbox.metrics.base import Metrics, ScopeHealth

__all__ = ["OpenTelemetryMetrics"]

# Bucket advice (opentelemetry-api 1.30+): the SDK's default buckets are meant for milliseconds.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class OpenTelemetryMetrics(Metrics):
    """Records through `meter_provider` (default: the global one)."""

    def __init__(self, meter_provider: otel.MeterProvider | None = None) -> None:
        meter = otel.get_meter("outbox", meter_provider=meter_provider)

        def seconds(name: str, doc: str) -> otel.Histogram:
            return meter.create_histogram(
                name, "s", doc, explicit_bucket_boundaries_advisory=SECONDS_BUCKETS
            )

        self._saved = meter.create_counter("outbox.saved", "{row}", "Outbox rows saved.")
        self._processed = meter.create_counter(
            "outbox.processed", "{row}", "Outbox rows retired by a delivery."
        )
        self._failed = meter.create_counter(
            "outbox.failed", "{message}", "Failed deliveries of outbox messages."
        )
        self._dead_lettered = meter.create_counter(
            "outbox.dead_lettered", "{message}", "Outbox messages dead-lettered."
        )
        self._leases_lost = meter.create_counter(
            "outbox.leases_lost", "{lease}", "Shard leases lost."
        )
        self._lag = seconds(
            "outbox.processing_lag", "Age of the delivered outbox row when its receivers ran."
        )
        self._duration = seconds(
            "outbox.send_duration", "Time the receivers of one outbox message took."
        )
        self._receiver_duration = seconds(
            "outbox.receiver_duration", "Time one receiver took for one outbox message."
        )
        self._claim_duration = seconds(
            "outbox.claim_duration", "Time one claim of due shards took."
        )
        self._backlog_rows = meter.create_gauge(
            "outbox.backlog.rows", "{row}", "Outbox rows waiting, per scope."
        )
        self._backlog_shards = meter.create_gauge(
            "outbox.backlog.shards", "{shard}", "Outbox shards with rows waiting."
        )
        self._stuck_receivers = meter.create_gauge(
            "outbox.stuck_receivers",
            "{thread}",
            "Receiver threads still running calls given up at the timeout.",
        )
        self._health = {
            field: meter.create_gauge(name, unit, doc) for field, name, unit, doc in _HEALTH_GAUGES
        }
        self._read_at = meter.create_gauge(
            "outbox.gauges_read_timestamp", "s", "When the outbox gauges were read (Unix time)."
        )
        self._xmin_age = meter.create_gauge(
            "outbox.oldest_xmin_age", "s", "Age of the oldest transaction vacuum must respect."
        )
        self._xmin_xid_age = meter.create_gauge(
            "outbox.oldest_xmin_xid_age",
            "{transaction}",
            "Transaction ids since the oldest one vacuum must respect.",
        )
        self._dead_tuples = meter.create_gauge(
            "outbox.dead_tuples", "{tuple}", "Dead tuples not yet vacuumed."
        )

    def saved(self, table: str, scope: str, category: str, count: int) -> None:
        self._saved.add(count, _attributes(table, scope, category))

    def processed(
        self,
        table: str,
        scope: str,
        category: str,
        rows: int,
        lag_seconds: float | None,
        duration_seconds: float,
    ) -> None:
        attributes = _attributes(table, scope, category)
        self._processed.add(rows, attributes)
        if lag_seconds is not None:
            self._lag.record(max(lag_seconds, 0.0), attributes)
        self._duration.record(duration_seconds, attributes)

    def failed(self, table: str, scope: str, category: str) -> None:
        self._failed.add(1, _attributes(table, scope, category))

    def dead_lettered(self, table: str, scope: str, category: str) -> None:
        self._dead_lettered.add(1, _attributes(table, scope, category))

    def lease_lost(self, table: str, scope: str) -> None:
        self._leases_lost.add(1, _attributes(table, scope))

    def backlog(self, table: str, scope: str, rows: int, shards: int) -> None:
        attributes = _attributes(table, scope)
        self._backlog_rows.set(rows, attributes)
        self._backlog_shards.set(shards, attributes)

    def health(self, table: str, scope: str, health: ScopeHealth) -> None:
        attributes = _attributes(table, scope)
        for field, value in asdict(health).items():
            self._health[field].set(value, attributes)

    def gauges_read(self, table: str, timestamp: float) -> None:
        self._read_at.set(timestamp, {"outbox.table": table})

    def receiver_finished(
        self, table: str, scope: str, category: str, receiver: str, duration_seconds: float
    ) -> None:
        attributes = {**_attributes(table, scope, category), "outbox.receiver": receiver}
        self._receiver_duration.record(duration_seconds, attributes)

    def claimed(self, table: str, shards: int, duration_seconds: float) -> None:
        self._claim_duration.record(duration_seconds, {"outbox.table": table})

    def stuck_receivers(self, table: str, count: int) -> None:
        self._stuck_receivers.set(count, {"outbox.table": table})

    def xmin_horizon(self, database: str, age_seconds: float | None, xid_age: int) -> None:
        attributes = {"outbox.database": database}
        if age_seconds is not None:
            self._xmin_age.set(age_seconds, attributes)
        self._xmin_xid_age.set(xid_age, attributes)

    def dead_tuples(self, table: str, database: str, count: int) -> None:
        self._dead_tuples.set(count, {"outbox.table": table, "outbox.database": database})


def _attributes(table: str, scope: str, category: str | None = None) -> dict[str, str]:
    attributes = {"outbox.table": table, "outbox.scope": scope}
    if category is not None:
        attributes["outbox.category"] = category
    return attributes


# ScopeHealth's fields, and the gauge each one is recorded as.
_HEALTH_GAUGES = (
    ("oldest_due_age_seconds", "outbox.oldest_due_age", "s", "Age of the oldest due row."),
    ("due_rows", "outbox.due_rows", "{row}", "Outbox rows due for delivery."),
    ("due_shards", "outbox.due_shards", "{shard}", "Outbox shards with rows due."),
    ("failing_shards", "outbox.failing_shards", "{shard}", "Shards whose row waits a retry."),
    ("dead_letters", "outbox.dead_letters", "{message}", "Outbox messages given up."),
    ("expired_leases", "outbox.expired_leases", "{shard}", "Shards whose lease ran out."),
    ("paused_parts", "outbox.paused_parts", "{pause}", "Paused parts of the scope."),
)
