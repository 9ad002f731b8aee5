"""StatsD adapter (`OUTBOX_METRICS = "statsd"`), on the `statsd` package.

Plain StatsD has no tags, so labels become name segments after the prefix
(`OUTBOX_STATSD_PREFIX`, default ``outbox``), each made safe for Graphite:
``outbox.saved.<table>.<scope>.<category>`` (likewise ``processed``, ``failed``,
``dead_lettered``), ``outbox.leases_lost.<table>.<scope>``, the timers
``outbox.processing_lag.<table>.<scope>.<category>`` and
``outbox.send_duration.<table>.<scope>.<category>``,
``outbox.receiver_duration.<table>.<scope>.<category>.<receiver>`` and
``outbox.claim_duration.<table>`` (milliseconds, as StatsD times), and
the gauges ``outbox.backlog_rows.<table>.<scope>``, ``outbox.backlog_shards.<...>`` and
``outbox.stuck_receivers.<table>`` (a process's own count: with several processes it
shows the last one sent, as StatsD gauges do not add up), the health gauges
``outbox.oldest_due_age_seconds.<table>.<scope>`` (likewise ``due_rows``, ``due_shards``,
``failing_shards``, ``dead_letters``, ``expired_leases``) and
``outbox.gauges_read_timestamp_seconds.<table>``; on PostgreSQL the vacuum gauges
``outbox.oldest_xmin_age_seconds.<database>`` (not sent where PostgreSQL does not show
it), ``outbox.oldest_xmin_xid_age.<database>`` and ``outbox.dead_tuples.<table>.<database>``.
The table is its model label with the dot replaced: ``outbox_RegionOutbox``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict

from statsd import StatsClient

from outbox.conf import outbox_settings
from outbox.metrics.base import Metrics, ScopeHealth

__all__ = ["StatsdMetrics"]


class StatsdMetrics(Metrics):
    """Sends UDP packets to `OUTBOX_STATSD_HOST`:`OUTBOX_STATSD_PORT`, or through `client`."""

    def __init__(self, client: StatsClient | None = None) -> None:
        self.client = client or StatsClient(
            host=outbox_settings.STATSD_HOST,
            port=outbox_settings.STATSD_PORT,
            prefix=outbox_settings.STATSD_PREFIX,
        )

    def saved(self, table: str, scope: str, category: str, count: int) -> None:
        self.client.incr(_name("saved", table, scope, category), count)

    def processed(
        self,
        table: str,
        scope: str,
        category: str,
        rows: int,
        lag_seconds: float | None,
        duration_seconds: float,
    ) -> None:
        with self.client.pipeline() as batch:  # one packet for the three values
            batch.incr(_name("processed", table, scope, category), rows)
            if lag_seconds is not None:
                lag_ms = max(lag_seconds, 0.0) * 1000
                batch.timing(_name("processing_lag", table, scope, category), lag_ms)
            duration_ms = duration_seconds * 1000
            batch.timing(_name("send_duration", table, scope, category), duration_ms)

    def failed(self, table: str, scope: str, category: str) -> None:
        self.client.incr(_name("failed", table, scope, category))

    def dead_lettered(self, table: str, scope: str, category: str) -> None:
        self.client.incr(_name("dead_lettered", table, scope, category))

    def lease_lost(self, table: str, scope: str) -> None:
        self.client.incr(_name("leases_lost", table, scope))

    def backlog(self, table: str, scope: str, rows: int, shards: int) -> None:
        with self.client.pipeline() as batch:
            batch.gauge(_name("backlog_rows", table, scope), rows)
            batch.gauge(_name("backlog_shards", table, scope), shards)

    def health(self, table: str, scope: str, health: ScopeHealth) -> None:
        with self.client.pipeline() as batch:
            for name, value in asdict(health).items():
                batch.gauge(_name(name, table, scope), value)

    def gauges_read(self, table: str, timestamp: float) -> None:
        self.client.gauge(_name("gauges_read_timestamp_seconds", table), timestamp)

    def receiver_finished(
        self, table: str, scope: str, category: str, receiver: str, duration_seconds: float
    ) -> None:
        name = _name("receiver_duration", table, scope, category, receiver)
        self.client.timing(name, duration_seconds * 1000)

    def claimed(self, table: str, shards: int, duration_seconds: float) -> None:
        self.client.timing(_name("claim_duration", table), duration_seconds * 1000)

    def stuck_receivers(self, table: str, count: int) -> None:
        self.client.gauge(_name("stuck_receivers", table), count)

    def xmin_horizon(self, database: str, age_seconds: float | None, xid_age: int) -> None:
        with self.client.pipeline() as batch:
            if age_seconds is not None:
                batch.gauge(_name("oldest_xmin_age_seconds", database), age_seconds)
            batch.gauge(_name("oldest_xmin_xid_age", database), xid_age)

    def dead_tuples(self, table: str, database: str, count: int) -> None:
        self.client.gauge(_name("dead_tuples", table, database), count)


@functools.lru_cache(maxsize=4096)
def _name(*segments: str) -> str:
    return ".".join(_UNSAFE.sub("_", segment) for segment in segments)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
