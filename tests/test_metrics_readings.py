"""Gauges an alert can fire on: the expired leases read by the project's own /metrics
with no drain running (`outbox.metrics.views.prometheus_metrics`), the vacuum health
`outbox_status` shows, as gauges (PostgreSQL), and `outbox_leases_lost_total` counted when
a drain finds its lease taken."""

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connections
from django.urls import path
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import outbox.metrics
import outbox.metrics.backlog
from outbox.engine import drain_outboxes
from outbox.metrics import install, record_backlog
from outbox.metrics.prometheus import PrometheusMetrics
from outbox.metrics.views import prometheus_metrics
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Scope

urlpatterns = [path("metrics", prometheus_metrics)]

ORGANIZATION = {"table": "outbox.RegionOutbox", "scope": "ORGANIZATION"}
postgres_only = pytest.mark.skipif(
    django_settings.TEST_DB != "postgres", reason="vacuum figures exist on PostgreSQL only"
)


@pytest.fixture
def registry(settings):
    """Prometheus metrics installed, recording into a registry of the test's own."""
    settings.OUTBOX_METRICS = "prometheus"
    settings.OUTBOX_METRICS_REFRESH_SECONDS = 0  # every scrape reads
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()
    registry = CollectorRegistry()
    install(PrometheusMetrics(registry))
    yield registry
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()


def scraped(client) -> dict[tuple[str, frozenset], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def expired(values) -> float | None:
    return values.get(("outbox_expired_leases", frozenset(ORGANIZATION.items())))


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=["default", "control"])
def test_the_projects_metrics_view_reads_expired_leases_with_no_drain_running(registry, client):
    """A drain died holding a lease: nothing else runs, yet each scrape reads the gauge."""
    assert expired(scraped(client)) == 0
    ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=Scope.ORGANIZATION,
        shard_identifier=1,
        token="a" * 32,
        holder="a drain that died",
        expires_at=timezone.now() - timedelta(seconds=60),
    )
    assert expired(scraped(client)) == 1
    ShardLease.objects.all().delete()  # a drain retook and released it
    assert expired(scraped(client)) == 0


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=["default", "control"])
def test_the_metrics_view_says_why_it_serves_nothing_without_prometheus(settings, client):
    settings.OUTBOX_METRICS = None
    outbox.metrics.uninstall()
    response = client.get("/metrics")
    assert response.status_code == 503
    assert b'OUTBOX_METRICS is None, not "prometheus"' in response.content
    assert client.post("/metrics").status_code == 405


@postgres_only
@committing
def test_the_vacuum_health_is_a_gauge_on_postgresql(registry):
    """A session idle in a transaction holds the xmin horizon: its age is read, in seconds
    and in transaction ids, with the dead tuples of the outbox and lease tables."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT txid_current()")
            RegionOutboxFactory(shard_identifier=1)  # a transaction after it: xid age 1+
            record_backlog()
            value = registry.get_sample_value
            first = value("outbox_oldest_xmin_age_seconds", {"database": "default"})
            assert first is not None and first >= 0
            assert value("outbox_oldest_xmin_xid_age", {"database": "default"}) >= 1
            for table in ("outbox.RegionOutbox", "outbox.ShardLease"):
                labels = {"table": table, "database": "default"}
                assert value("outbox_dead_tuples", labels) >= 0, table
            assert value("outbox_oldest_xmin_age_seconds", {"database": "control"}) is not None
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    RegionOutbox.objects.all().delete()


@pytest.mark.skipif(django_settings.TEST_DB == "postgres", reason="PostgreSQL has the figures")
@pytest.mark.django_db(databases=["default", "control"])
def test_no_vacuum_gauges_where_the_database_has_no_such_figures(registry):
    record_backlog()
    assert registry.get_sample_value("outbox_oldest_xmin_xid_age", {"database": "default"}) is None


@committing
def test_a_lease_taken_during_a_call_is_counted_in_leases_lost_total(registry, calls):
    """Another worker takes the shard's lease while the receiver runs (this one was paused
    past its lease): the settle finds it gone, and the counter moves."""

    def taken(sender, kwargs):
        ShardLease.objects.update(token="theirs")

    calls.during_call = taken
    RegionOutboxFactory(shard_identifier=4)
    assert drain_outboxes().leases_lost == 1
    assert registry.get_sample_value("outbox_leases_lost_total", ORGANIZATION) == 1
    calls.during_call = None
    RegionOutbox.objects.all().delete()
    ShardLease.objects.all().delete()
