"""Metrics: one small interface, an adapter chosen by `OUTBOX_METRICS`, fed by signals.

`install()` (called when the app is ready) builds the adapter that `OUTBOX_METRICS`
names and connects receivers to the lifecycle signals (`outbox.signals`); with the
setting unset it connects nothing, so the engine's `has_listeners()` checks skip the
signals and metrics cost nothing. `record_backlog()` reads the backlog and its health
per table and scope, three aggregate queries per table, for the drain loop's heartbeat,
for the timer of a Celery or Django Tasks worker (`refresh`) and, with
`PrometheusScrapeMetrics`, for each scrape; it too does nothing when unset.

Every metric is prefixed ``outbox`` and labelled with the table (its model label, e.g.
``outbox.RegionOutbox``) and the scope and category names:

- saved, processed (rows; coalesced rows included), failed, dead_lettered: counters
  per table, scope and category;
- leases_lost: counter per table and scope;
- processing_lag (age of the delivered row, seconds) and send_duration (the receivers'
  time, seconds): histograms per table, scope and category;
- receiver_duration (one receiver's time, seconds): histogram per table, scope, category
  and receiver (`module.qualname`);
- claim_duration (one claim of shards, seconds): histogram per table;
- backlog_rows and backlog_shards: gauges per table and scope;
- what is wrong now (`ScopeHealth`): oldest_due_age_seconds, due_rows, due_shards,
  failing_shards, dead_letters, expired_leases: gauges per table and scope, and
  gauges_read_timestamp_seconds (when they were read) per table;
- stuck_receivers (this process's receiver threads still running calls given up at
  `OUTBOX_RECEIVER_TIMEOUT_SECONDS`): gauge per table;
- on PostgreSQL, the vacuum health `outbox_status` shows: oldest_xmin_age_seconds and
  oldest_xmin_xid_age per database, dead_tuples per table and database.

A process withdraws its gauges as it exits (`Metrics.process_ended`).

The interface is in `base`, the installed adapter and its signal receivers in `feed`,
the backlog reading in `backlog` (its queries in `reading`), the timer in `refresh`, the
project's own /metrics in `views`; the adapters in `prometheus`, `statsd` and `otel`.
"""

from outbox.metrics.backlog import record_backlog
from outbox.metrics.base import ADAPTERS, Metrics, ScopeHealth, build_metrics
from outbox.metrics.feed import install, installed, uninstall

__all__ = [
    "ADAPTERS",
    "Metrics",
    "ScopeHealth",
    "build_metrics",
    "install",
    "installed",
    "record_backlog",
    "uninstall",
]
