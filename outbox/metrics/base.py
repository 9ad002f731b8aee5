"""The `Metrics` interface, and the adapter `OUTBOX_METRICS` chooses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.exceptions import MetricsUnavailable

__all__ = [
    "ADAPTERS",
    "Metrics",
    "ScopeHealth",
    "build_metrics",
    "metrics_class",
    "table_label",
]

ADAPTERS = {
    "prometheus": "outbox.metrics.prometheus.PrometheusMetrics",
    "statsd": "outbox.metrics.statsd.StatsdMetrics",
    "opentelemetry": "outbox.metrics.otel.OpenTelemetryMetrics",
}
"""The short names `OUTBOX_METRICS` accepts, and the adapter class each one stands for."""


@dataclass(frozen=True)
class ScopeHealth:
    """What is wrong now in one scope of one table, at one reading (all 0: nothing).

    oldest_due_age_seconds: age of the oldest due row (its shard waits behind it, or
    no drain runs); due_rows, due_shards: the rows whose time has come and their shards;
    failing_shards: shards with a row that failed and waits for its retry (a poison
    message blocks its shard so, while OUTBOX_MAX_ATTEMPTS is 0); dead_letters: the
    messages given up; expired_leases: shards whose worker's lease ran out (abandoned);
    paused_parts: the pauses in the scope (the scope itself, its shards, its categories:
    `outbox.models.pause`), whose messages wait for an operator to resume them.
    """

    oldest_due_age_seconds: float = 0.0
    due_rows: int = 0
    due_shards: int = 0
    failing_shards: int = 0
    dead_letters: int = 0
    expired_leases: int = 0
    paused_parts: int = 0


class Metrics:
    """Where the outbox reports what it did. Every method here is a no-op.

    An adapter overrides the methods its backend records. `table` is the outbox model's
    label, `scope` and `category` are member names (the stored integer as text if no
    enum declares it). Methods are called from the receivers of the lifecycle signals,
    in the thread that did the work; an exception they raise is logged, never passed on
    to the engine.
    """

    def saved(self, table: str, scope: str, category: str, count: int) -> None:
        """`count` rows of one scope and category were written."""

    def processed(
        self,
        table: str,
        scope: str,
        category: str,
        rows: int,
        lag_seconds: float | None,
        duration_seconds: float,
    ) -> None:
        """A message was delivered, retiring `rows` rows (coalesced ones included)."""

    def failed(self, table: str, scope: str, category: str) -> None:
        """A delivery failed (it is retried later, or was dead-lettered)."""

    def dead_lettered(self, table: str, scope: str, category: str) -> None:
        """A message ran out of attempts and became a dead letter."""

    def lease_lost(self, table: str, scope: str) -> None:
        """A worker found its lease on a shard of `scope` gone before it settled."""

    def backlog(self, table: str, scope: str, rows: int, shards: int) -> None:
        """`rows` rows in `shards` shards of `scope` were waiting, at one reading."""

    def health(self, table: str, scope: str, health: ScopeHealth) -> None:
        """What is wrong now in `scope`, at one reading (see `ScopeHealth`)."""

    def gauges_read(self, table: str, timestamp: float) -> None:
        """The backlog and health of `table` were read at `timestamp` (Unix seconds): an
        alert on its age notices readings that stopped."""

    def receiver_finished(
        self, table: str, scope: str, category: str, receiver: str, duration_seconds: float
    ) -> None:
        """One receiver (`module.qualname`) ran for a message, for `duration_seconds`."""

    def claimed(self, table: str, shards: int, duration_seconds: float) -> None:
        """A claim of shards took `duration_seconds` and won `shards` (maybe 0)."""

    def stuck_receivers(self, table: str, count: int) -> None:
        """`count` receiver threads of this process are stuck in calls given up at the
        timeout (`OUTBOX_RECEIVER_TIMEOUT_SECONDS`); 0 once the last of them returned."""

    def xmin_horizon(self, database: str, age_seconds: float | None, xid_age: int) -> None:
        """On PostgreSQL, at one reading: how old the oldest transaction id is that
        vacuum of `database` must keep (`outbox.health.vacuum`'s oldest xmin holder), in
        seconds (None where PostgreSQL does not show it: a replication slot, another
        role's session) and in transaction ids; 0 and 0 when nothing holds one."""

    def dead_tuples(self, table: str, database: str, count: int) -> None:
        """On PostgreSQL, at one reading: the dead tuples of `table` (an outbox table's
        label, or ``outbox.ShardLease``) in `database` that no vacuum removed yet."""

    def process_ended(self) -> None:
        """This process stops recording: withdraw the values that stand for it alone
        (in Prometheus' multiprocess mode, its files of live gauges), so that they are
        not shown after it is gone. Called at interpreter exit (`outbox.metrics.feed`)
        and as a Celery pool process shuts down."""


def build_metrics() -> Metrics | None:
    """The adapter `OUTBOX_METRICS` chooses, freshly built; None when it is unset."""
    adapter = metrics_class()
    return adapter() if adapter is not None else None


def metrics_class() -> type[Metrics] | None:
    """The adapter class `OUTBOX_METRICS` chooses, imported; None when it is unset.

    Raises MetricsUnavailable when it cannot be imported (its library is not installed)
    or is no Metrics subclass."""
    choice = outbox_settings.METRICS
    if not choice:
        return None
    try:
        adapter = import_string(ADAPTERS.get(choice, choice))
    except ImportError as error:
        raise MetricsUnavailable(
            f"OUTBOX_METRICS = {choice!r} cannot be loaded ({error}).", _fix(choice)
        ) from error
    if not (isinstance(adapter, type) and issubclass(adapter, Metrics)):
        raise MetricsUnavailable(
            f"OUTBOX_METRICS = {choice!r} is not a subclass of outbox.metrics.Metrics.",
            _fix(choice),
        )
    return adapter


def _fix(choice: str) -> str:
    if choice in ADAPTERS:
        return f"Install its library: pip install 'django-outboxes[{choice}]'."
    return (
        f"Use one of {', '.join(map(repr, ADAPTERS))} with its library installed (e.g. "
        "pip install 'django-outboxes[prometheus]'), or the dotted path of a Metrics "
        "subclass."
    )


def table_label(model: type[Any]) -> str:
    """The `table` every method is given: the outbox model's label."""
    return str(model._meta.label)
