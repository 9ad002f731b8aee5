"""Issue #35 (finding 4): gauges that say what is wrong now, per table and scope.

The processing lag histogram only sees rows that were delivered, so a shard blocked
behind a failing message was invisible in metrics. These gauges read the table itself:
the oldest due row's age, due rows and shards, failing shards, dead letters, expired
(abandoned) leases; refreshed by the drain loop's heartbeat, at a scrape, and by a timer
thread in Celery and Django Tasks workers that survives a lost connection. Real
databases and a real prometheus_client registry."""

import fcntl
import io
import logging
import os
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone
from prometheus_client import CollectorRegistry

import outbox.metrics
import outbox.metrics.backlog
from outbox.engine import drain_outboxes
from outbox.metrics import install, record_backlog
from outbox.metrics.prometheus import PrometheusMetrics, PrometheusScrapeMetrics
from outbox.metrics.refresh import LOCK_NAME, RefreshTimer, running_timer, stop_refresh
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.test_bad_input import _server_id
from tests.test_heartbeat_reconnect import _terminate
from tests.testapp.categories import Scope
from tests.workers import wait_until

ORGANIZATION = {"table": "outbox.RegionOutbox", "scope": "ORGANIZATION"}
USER = {"table": "outbox.RegionOutbox", "scope": "USER"}


@pytest.fixture(autouse=True)
def uninstalled():
    """No metrics installed, no scopes remembered and no timer running, before and after."""
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()
    stop_refresh()
    yield
    stop_refresh()
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()


@pytest.fixture
def registry():
    registry = CollectorRegistry()
    install(PrometheusMetrics(registry))
    return registry


def gauge(registry, name, labels=ORGANIZATION):
    return registry.get_sample_value(f"outbox_{name}", labels)


def backdate(minutes):
    RegionOutbox.objects.update(date_added=timezone.now() - timedelta(minutes=minutes))


@committing
def test_a_shard_blocked_behind_a_failing_message_shows_its_age_and_as_failing(calls, registry):
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)  # the poison message
    RegionOutboxFactory(shard_identifier=1, object_identifier=2)  # waits behind it
    RegionOutboxFactory(shard_identifier=2, object_identifier=3)
    calls.failing = {1}
    drain_outboxes()  # shard 2 delivered; shard 1 fails at its head and backs off
    assert RegionOutbox.objects.count() == 2
    backdate(minutes=10)
    record_backlog()
    assert gauge(registry, "failing_shards") == 1
    assert 600 <= gauge(registry, "oldest_due_age_seconds") < 700  # the row behind it
    assert gauge(registry, "due_rows") == 1  # the head waits out its back-off
    assert gauge(registry, "due_shards") == 1
    assert gauge(registry, "dead_letters") == 0
    assert gauge(registry, "expired_leases") == 0
    calls.failing = set()
    RegionOutbox.objects.update(scheduled_for=Now())
    ShardLease.objects.all().delete()  # an operator's retry of the shard
    drain_outboxes()
    record_backlog()
    assert gauge(registry, "failing_shards") == 0
    assert gauge(registry, "oldest_due_age_seconds") == 0
    assert gauge(registry, "due_rows") == 0


@pytest.mark.django_db(databases=["default", "control"])
def test_dead_letters_are_counted_per_scope_and_not_as_due(registry):
    for identifier in (1, 1, 2):
        RegionOutboxFactory(shard_identifier=identifier)
    RegionOutbox.objects.filter(shard_identifier=1).update(dead_at=timezone.now())
    record_backlog()
    assert gauge(registry, "dead_letters") == 2
    assert gauge(registry, "due_rows") == 1
    assert gauge(registry, "backlog_rows") == 1
    RegionOutbox.objects.dead().discard()
    record_backlog()
    assert gauge(registry, "dead_letters") == 0


def lease(identifier, *, token, seconds):
    ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=Scope.ORGANIZATION,
        shard_identifier=identifier,
        token=token,
        holder="worker-1" if token else "",
        expires_at=timezone.now() + timedelta(seconds=seconds),
    )


@pytest.mark.django_db(databases=["default", "control"])
def test_expired_leases_count_abandoned_ones_only(registry):
    lease(1, token="a" * 32, seconds=-60)  # a worker's lease ran out: stuck
    lease(2, token="b" * 32, seconds=60)  # held
    lease(3, token=None, seconds=-60)  # a back-off over: a routine retry due
    lease(4, token=None, seconds=60)  # backing off
    record_backlog()
    assert gauge(registry, "expired_leases") == 1
    ShardLease.objects.filter(shard_identifier=1).delete()
    record_backlog()
    assert gauge(registry, "expired_leases") == 0


@pytest.mark.django_db(databases=["default", "control"])
def test_every_declared_scope_is_reported_even_if_this_process_never_saw_it(registry):
    """In multiprocess mode another process may have reported the scope; 0 must win."""
    record_backlog()
    assert gauge(registry, "backlog_rows", USER) == 0
    assert gauge(registry, "dead_letters", USER) == 0
    reading = gauge(registry, "gauges_read_timestamp_seconds", {"table": "outbox.RegionOutbox"})
    assert abs(reading - time.time()) < 60


@pytest.mark.django_db(databases=["default", "control"])
def test_a_scrape_reads_the_health_gauges_too():
    registry = CollectorRegistry()
    PrometheusScrapeMetrics(registry)
    RegionOutboxFactory()
    RegionOutbox.objects.update(dead_at=timezone.now())
    assert gauge(registry, "dead_letters") == 1


@committing
def test_the_drain_loop_reads_them_at_its_heartbeat(settings, registry):
    settings.OUTBOX_HEARTBEAT_SECONDS = 0.2
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.1
    RegionOutboxFactory()
    RegionOutbox.objects.update(dead_at=timezone.now())
    call_command("drain_outboxes", "--loop", "--max-seconds", "1", stdout=io.StringIO())
    assert gauge(registry, "dead_letters") == 1
    assert gauge(registry, "dead_letters", USER) == 0


# The timer: a thread of its own in a worker process


@pytest.fixture
def fast_timer(settings, registry):
    settings.OUTBOX_METRICS_REFRESH_SECONDS = 0.2
    return registry


@committing
def test_the_timer_refreshes_the_gauges_in_a_thread_of_its_own(fast_timer):
    timer = outbox.metrics.refresh.start_refresh()
    assert timer is not None and timer.is_alive()
    assert outbox.metrics.refresh.start_refresh() is timer  # one per process
    RegionOutboxFactory()
    RegionOutbox.objects.update(dead_at=timezone.now())
    wait_until(lambda: gauge(fast_timer, "dead_letters") == 1, 5)
    RegionOutbox.objects.all().delete()
    wait_until(lambda: gauge(fast_timer, "dead_letters") == 0, 5)


def test_no_timer_without_metrics_or_with_the_interval_0(settings):
    assert outbox.metrics.refresh.start_refresh() is None  # no metrics installed
    install(PrometheusMetrics(CollectorRegistry()))
    settings.OUTBOX_METRICS_REFRESH_SECONDS = 0
    assert outbox.metrics.refresh.start_refresh() is None


class ServerIds(PrometheusMetrics):
    """Notes the server-side id of the connection each reading was made on."""

    def __init__(self, registry):
        super().__init__(registry)
        self.ids = []

    def gauges_read(self, table, timestamp):
        super().gauges_read(table, timestamp)
        if table == "outbox.RegionOutbox":
            self.ids.append(_server_id(connection))


@committing
@server_database_only
def test_the_timer_reads_again_after_its_connection_was_killed(settings, caplog):
    settings.OUTBOX_METRICS_REFRESH_SECONDS = 0.2
    registry = CollectorRegistry()
    metrics = install(ServerIds(registry))
    timer = outbox.metrics.refresh.start_refresh()
    wait_until(lambda: metrics.ids, 5)
    _terminate(metrics.ids[-1])  # the timer's connection, between two readings
    with caplog.at_level(logging.WARNING, logger="outbox.metrics"):
        RegionOutboxFactory()
        RegionOutbox.objects.update(dead_at=timezone.now())
        wait_until(lambda: gauge(registry, "dead_letters") == 1, 5)
    assert metrics.ids[-1] != metrics.ids[0]  # a new connection
    assert "outbox could not read the gauges; reconnecting" in caplog.text
    assert timer.is_alive()


@committing
def test_a_celery_worker_starts_the_timer_with_its_first_outbox_task(fast_timer):
    from outbox.integrations import celery

    assert running_timer() is None
    assert celery.schedule_drains() == 0  # nothing due: nothing sent
    assert running_timer() is not None


@committing
def test_a_django_tasks_worker_starts_the_timer_with_its_first_outbox_task(fast_timer):
    pytest.importorskip("django.tasks", reason="Django Tasks needs Django 6")
    from outbox.integrations import django_tasks

    django_tasks.drain_all.call()
    assert running_timer() is not None


# Prometheus multiprocess mode: one reading per interval for all processes


class Counting(PrometheusMetrics):
    def __init__(self, registry):
        super().__init__(registry)
        self.readings = 0

    def gauges_read(self, table, timestamp):
        self.readings += table == "outbox.RegionOutbox"


@pytest.mark.django_db(databases=["default", "control"])
def test_with_a_multiprocess_directory_one_process_reads_per_interval(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics = install(Counting(CollectorRegistry()))
    first, second = RefreshTimer(60), RefreshTimer(60)  # as in two processes: not started
    assert first.refresh()
    assert not second.refresh()  # the reading is fresh
    assert metrics.readings == 1
    stale = time.time() - 61
    os.utime(tmp_path / LOCK_NAME, (stale, stale))
    assert second.refresh()
    assert metrics.readings == 2


@pytest.mark.django_db(databases=["default", "control"])
def test_with_a_multiprocess_directory_a_reading_under_way_is_not_repeated(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics = install(Counting(CollectorRegistry()))
    holder = os.open(tmp_path / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    os.utime(holder, (0, 0))  # the last reading long ago
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another process reads now
        assert not RefreshTimer(60).refresh()
    finally:
        os.close(holder)
    assert metrics.readings == 0
    assert RefreshTimer(60).refresh()


class Failing(PrometheusMetrics):
    def gauges_read(self, table, timestamp):
        raise RuntimeError("the metrics backend is down")


@pytest.mark.django_db(databases=["default", "control"])
def test_a_failed_reading_gives_the_turn_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    install(Failing(CollectorRegistry()))
    with caplog.at_level(logging.ERROR, logger="outbox.metrics"):
        assert not RefreshTimer(60).refresh()
    assert "Reading the outbox gauges failed" in caplog.text
    counting = install(Counting(CollectorRegistry()))
    assert RefreshTimer(60).refresh()  # at once, not an interval later
    assert counting.readings == 1
