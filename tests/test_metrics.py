"""Metrics: the interface, the three adapters against their real libraries, the wiring."""

import logging
import socket
import sys

import pytest
from django.apps import apps
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

import outbox.engine
import outbox.metrics
import outbox.metrics.backlog
from outbox import signals
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.metrics import Metrics, build_metrics, install, record_backlog
from outbox.metrics.otel import OpenTelemetryMetrics
from outbox.metrics.prometheus import PrometheusMetrics, PrometheusScrapeMetrics
from outbox.metrics.statsd import StatsdMetrics
from outbox.models import RegionOutbox
from outbox.shards import ShardKey
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category, Scope

LIFECYCLE = (
    signals.messages_saved,
    signals.message_processed,
    signals.delivery_failed,
    signals.message_dead_lettered,
    signals.lease_lost,
    signals.shards_claimed,
    signals.receivers_stuck,
)
SHARD = ShardKey("", Scope.ORGANIZATION, 1)
REGION = {"table": "outbox.RegionOutbox", "scope": "ORGANIZATION", "category": "AUDIT_EVENT"}
# The testapp's receiver of AUDIT_EVENT, as the per-receiver metrics name it.
AUDIT_RECEIVER = "tests.testapp.receivers.record"


@pytest.fixture(autouse=True)
def uninstalled():
    """Every test starts and ends with no metrics installed and no backlog reported."""
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()
    yield
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()


def send_lifecycle_signals():
    """Each lifecycle signal once, with the documented keyword arguments."""
    rows = [RegionOutbox(shard_scope=Scope.ORGANIZATION, category=Category.AUDIT_EVENT)] * 2
    signals.messages_saved.send(sender=RegionOutbox, rows=rows, using="default")
    message = {"shard": SHARD, "category": Category.AUDIT_EVENT.value, "object_identifier": 7}
    signals.message_processed.send(
        sender=RegionOutbox,
        **message,
        rows=3,
        lag_seconds=0.5,
        duration_seconds=0.02,
        receiver_seconds={"app.receivers.audit": 0.015},
        using="default",
    )
    error = {"attempts": 3, "error": "boom", "using": "default"}
    signals.delivery_failed.send(
        sender=RegionOutbox, **message, **error, exception=RuntimeError("boom"), dead=True
    )
    signals.message_dead_lettered.send(sender=RegionOutbox, **message, **error)
    signals.lease_lost.send(sender=RegionOutbox, shard=SHARD, using="default")
    signals.shards_claimed.send(
        sender=RegionOutbox, shards=4, duration_seconds=0.003, using="default"
    )


# The interface and its wiring


def test_unset_connects_nothing_and_reads_no_backlog():
    before = [list(signal.receivers) for signal in LIFECYCLE]
    assert install() is None
    assert [list(signal.receivers) for signal in LIFECYCLE] == before
    record_backlog()  # no database access allowed here: it must not query


def test_the_setting_chooses_the_adapter():
    with override_settings(OUTBOX_METRICS="statsd"):
        statsd = build_metrics()
        statsd.client.close()
        assert type(statsd) is StatsdMetrics
    with override_settings(OUTBOX_METRICS="opentelemetry"):
        assert type(build_metrics()) is OpenTelemetryMetrics
    with override_settings(OUTBOX_METRICS="prometheus"):
        assert type(build_metrics()) is PrometheusMetrics  # the default registry, once
        assert build_metrics().instruments is build_metrics().instruments
    with override_settings(OUTBOX_METRICS="outbox.metrics.Metrics"):
        assert type(build_metrics()) is Metrics


@pytest.mark.parametrize("value", ["no.such.Adapter", "outbox.conf.Setting"])
def test_a_wrong_setting_names_itself(value):
    with override_settings(OUTBOX_METRICS=value), pytest.raises(OutboxConfigurationError) as error:
        build_metrics()
    assert f"OUTBOX_METRICS = {value!r}" in str(error.value)


@pytest.fixture
def without_prometheus_client(monkeypatch):
    """As if `prometheus_client` were not installed: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "outbox.metrics.prometheus")


def outbox_check_errors():
    return [error for error in run_checks() if error.id.startswith("outbox.")]


@pytest.mark.usefixtures("without_prometheus_client")
def test_a_missing_adapter_library_is_a_system_check_error_naming_the_extra():
    with override_settings(OUTBOX_METRICS="prometheus"):
        (error,) = outbox_check_errors()
        with pytest.raises(SystemCheckError, match=r"outbox\.E018") as raised:
            call_command("check")
    assert error.id == "outbox.E018"
    assert "OUTBOX_METRICS = 'prometheus' cannot be loaded (" in error.msg
    assert "prometheus_client" in error.msg
    assert error.hint == "Install its library: pip install 'django-outboxes[prometheus]'."
    assert "Traceback" not in str(raised.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [("no.such.Adapter", "cannot be loaded"), ("outbox.conf.Setting", "is not a subclass")],
)
def test_a_wrong_adapter_path_is_a_system_check_error(value, problem):
    with override_settings(OUTBOX_METRICS=value):
        (error,) = outbox_check_errors()
    assert error.id == "outbox.E018"
    assert f"OUTBOX_METRICS = {value!r} {problem}" in error.msg
    assert "'prometheus', 'statsd', 'opentelemetry'" in error.hint


def test_a_metrics_value_of_the_wrong_type_is_only_E011():
    with override_settings(OUTBOX_METRICS=1):
        assert [error.id for error in outbox_check_errors()] == ["outbox.E011"]


@pytest.mark.parametrize("value", ["prometheus", 1])
def test_the_app_starts_without_metrics_when_they_cannot_be_installed(
    value, without_prometheus_client, caplog
):
    # ready() raised before, so every manage.py command died before its checks ran.
    with override_settings(OUTBOX_METRICS=value), caplog.at_level(logging.ERROR, "outbox.metrics"):
        apps.get_app_config("outbox").ready()
    assert outbox.metrics.installed() is None
    assert "Outbox metrics are off: OUTBOX_METRICS" in caplog.text


def test_install_connects_once_and_uninstall_disconnects():
    with override_settings(OUTBOX_METRICS="outbox.metrics.Metrics"):
        metrics = install()
        assert install() is metrics
    assert all(len(signal.receivers) >= 1 for signal in LIFECYCLE)
    counts = [len(signal.receivers) for signal in LIFECYCLE]
    install(metrics)
    assert [len(signal.receivers) for signal in LIFECYCLE] == counts
    outbox.metrics.uninstall()
    assert [len(signal.receivers) for signal in LIFECYCLE] == [count - 1 for count in counts]


class Broken(Metrics):
    def processed(self, *args):
        raise OSError("metrics backend down")


def test_a_failing_adapter_is_logged_not_raised(caplog):
    install(Broken())
    with caplog.at_level(logging.ERROR, logger="outbox.metrics"):
        send_lifecycle_signals()
    assert "Recording outbox metrics failed" in caplog.text


def send_receivers_stuck(count):
    signals.receivers_stuck.send(sender=RegionOutbox, count=count, using="default")


def test_stuck_receivers_is_a_no_op_in_the_interface(caplog):
    install(Metrics())
    with caplog.at_level(logging.ERROR, logger="outbox.metrics"):
        send_receivers_stuck(2)
    assert Metrics().stuck_receivers("outbox.RegionOutbox", 2) is None
    assert caplog.text == ""


# Prometheus


@pytest.fixture
def registry():
    return CollectorRegistry()


def test_prometheus_records_the_signals(registry):
    install(PrometheusMetrics(registry))
    send_lifecycle_signals()
    value = registry.get_sample_value
    assert value("outbox_saved_total", REGION) == 2
    assert value("outbox_processed_total", REGION) == 3
    assert value("outbox_processing_lag_seconds_count", REGION) == 1
    assert value("outbox_processing_lag_seconds_sum", REGION) == 0.5
    assert value("outbox_send_duration_seconds_sum", REGION) == 0.02
    assert value("outbox_failed_total", REGION) == 1
    assert value("outbox_dead_lettered_total", REGION) == 1
    by_receiver = {**REGION, "receiver": "app.receivers.audit"}
    assert value("outbox_receiver_duration_seconds_sum", by_receiver) == 0.015
    assert value("outbox_claim_duration_seconds_sum", {"table": "outbox.RegionOutbox"}) == 0.003
    scope = {"table": "outbox.RegionOutbox", "scope": "ORGANIZATION"}
    assert value("outbox_leases_lost_total", scope) == 1


def test_prometheus_gauges_stuck_receivers(registry):
    install(PrometheusMetrics(registry))
    table = {"table": "outbox.RegionOutbox"}
    assert registry.get_sample_value("outbox_stuck_receivers", table) is None
    send_receivers_stuck(2)
    assert registry.get_sample_value("outbox_stuck_receivers", table) == 2
    send_receivers_stuck(0)
    assert registry.get_sample_value("outbox_stuck_receivers", table) == 0


def saved_backlog():
    """Three region rows in two ORGANIZATION shards, one control row in a USER shard."""
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    ControlOutboxFactory()


def backlog_values(registry, table, scope):
    labels = {"table": table, "scope": scope}
    return tuple(
        registry.get_sample_value(f"outbox_backlog_{n}", labels) for n in ("rows", "shards")
    )


@pytest.mark.django_db(databases=["default", "control"])
def test_record_backlog_reads_each_table_per_scope_and_zeroes_drained_scopes(
    registry, django_assert_num_queries
):
    install(PrometheusMetrics(registry))
    saved_backlog()
    # Pending rows, dead letters, expired leases; the control table: three more. On
    # PostgreSQL, three for the vacuum health of each database.
    vacuum = 3 if connection.vendor == "postgresql" else 0
    with django_assert_num_queries(3 + vacuum, using="default"):
        record_backlog()
    assert backlog_values(registry, "outbox.RegionOutbox", "ORGANIZATION") == (3, 2)
    assert backlog_values(registry, "outbox.ControlOutbox", "USER") == (1, 1)
    RegionOutbox.objects.filter(shard_identifier=2).update(dead_at=timezone.now())
    record_backlog()  # dead letters are not backlog
    assert backlog_values(registry, "outbox.RegionOutbox", "ORGANIZATION") == (2, 1)
    RegionOutbox.objects.all().delete()
    record_backlog()
    assert backlog_values(registry, "outbox.RegionOutbox", "ORGANIZATION") == (0, 0)


@pytest.mark.django_db(databases=["default", "control"])
def test_prometheus_scrape_metrics_read_the_backlog_on_each_scrape(registry):
    PrometheusScrapeMetrics(registry)  # not even installed: the scrape reads for itself
    saved_backlog()
    assert backlog_values(registry, "outbox.RegionOutbox", "ORGANIZATION") == (3, 2)
    RegionOutboxFactory(shard_identifier=3)
    assert backlog_values(registry, "outbox.RegionOutbox", "ORGANIZATION") == (4, 3)


@committing
def test_prometheus_end_to_end_save_and_drain(registry):
    install(PrometheusMetrics(registry))
    RegionOutboxFactory()
    drain_outboxes()
    assert registry.get_sample_value("outbox_saved_total", REGION) == 1
    assert registry.get_sample_value("outbox_processed_total", REGION) == 1
    assert registry.get_sample_value("outbox_send_duration_seconds_count", REGION) == 1
    by_receiver = {**REGION, "receiver": AUDIT_RECEIVER}
    assert registry.get_sample_value("outbox_receiver_duration_seconds_count", by_receiver) == 1
    claims = {"table": "outbox.RegionOutbox"}
    assert registry.get_sample_value("outbox_claim_duration_seconds_count", claims) >= 1
    # What a scrape shows: the processed count and the lag histogram, on every path.
    from prometheus_client import generate_latest

    scrape = generate_latest(registry).decode()
    assert "outbox_processed_total{" in scrape
    assert registry.get_sample_value("outbox_processing_lag_seconds_count", REGION) == 1
    assert 0 <= registry.get_sample_value("outbox_processing_lag_seconds_sum", REGION) < 60
    assert "outbox_processing_lag_seconds_bucket{" in scrape


# StatsD: real packets on a real UDP socket


@pytest.fixture
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(5)
        yield server


def received(server, count):
    """The first `count` StatsD lines sent to `server`, as {name: (value, type)}."""
    lines = []
    while len(lines) < count:
        lines += server.recv(65535).decode().splitlines()
    assert len(lines) == count, lines
    parsed = (line.split(":", 1) for line in lines)
    return {name: tuple(value.split("|")) for name, value in parsed}


@pytest.fixture
def statsd_metrics(udp):
    """StatsD metrics sending to `udp`, installed."""
    port = udp.getsockname()[1]
    with override_settings(
        OUTBOX_STATSD_HOST="127.0.0.1", OUTBOX_STATSD_PORT=port, OUTBOX_STATSD_PREFIX="app.outbox"
    ):
        metrics = StatsdMetrics()
    install(metrics)
    yield metrics
    metrics.client.close()


def test_statsd_sends_the_signals_as_packets(udp, statsd_metrics):
    send_lifecycle_signals()
    lines = received(udp, 9)
    names = "outbox_RegionOutbox.ORGANIZATION.AUDIT_EVENT"
    receiver = "app_receivers_audit"
    assert lines[f"app.outbox.receiver_duration.{names}.{receiver}"] == ("15.000000", "ms")
    assert lines["app.outbox.claim_duration.outbox_RegionOutbox"] == ("3.000000", "ms")
    assert lines[f"app.outbox.saved.{names}"] == ("2", "c")
    assert lines[f"app.outbox.processed.{names}"] == ("3", "c")
    assert lines[f"app.outbox.processing_lag.{names}"] == ("500.000000", "ms")
    assert lines[f"app.outbox.send_duration.{names}"] == ("20.000000", "ms")
    assert lines[f"app.outbox.failed.{names}"] == ("1", "c")
    assert lines[f"app.outbox.dead_lettered.{names}"] == ("1", "c")
    assert lines["app.outbox.leases_lost.outbox_RegionOutbox.ORGANIZATION"] == ("1", "c")


def test_statsd_gauges_stuck_receivers(udp, statsd_metrics):
    name = "app.outbox.stuck_receivers.outbox_RegionOutbox"
    send_receivers_stuck(2)
    assert received(udp, 1) == {name: ("2", "g")}
    send_receivers_stuck(0)
    assert received(udp, 1) == {name: ("0", "g")}


@pytest.mark.django_db(databases=["default", "control"])
def test_statsd_gauges_the_backlog(udp, statsd_metrics):
    saved_backlog()
    received(udp, 4)  # one "saved" packet per row
    record_backlog()
    parsed = (line.split(":", 1) for packet in all_packets(udp) for line in packet.splitlines())
    lines = {name: tuple(value.split("|")) for name, value in parsed}
    assert lines["app.outbox.backlog_rows.outbox_RegionOutbox.ORGANIZATION"] == ("3", "g")
    assert lines["app.outbox.backlog_shards.outbox_RegionOutbox.ORGANIZATION"] == ("2", "g")
    assert lines["app.outbox.backlog_rows.outbox_ControlOutbox.USER"] == ("1", "g")
    assert lines["app.outbox.due_shards.outbox_RegionOutbox.ORGANIZATION"] == ("2", "g")
    assert lines["app.outbox.dead_letters.outbox_RegionOutbox.USER"] == ("0", "g")
    assert "app.outbox.gauges_read_timestamp_seconds.outbox_RegionOutbox" in lines


@committing
def test_statsd_end_to_end_save_and_drain(udp, statsd_metrics):
    RegionOutboxFactory()
    assert received(udp, 1) == {
        "app.outbox.saved.outbox_RegionOutbox.ORGANIZATION.AUDIT_EVENT": ("1", "c")
    }
    drain_outboxes()
    packets = all_packets(udp)
    names = "outbox_RegionOutbox.ORGANIZATION.AUDIT_EVENT"
    # One packet per processed message: the lag is in it when known.
    (delivered,) = [packet for packet in packets if f"app.outbox.processed.{names}:" in packet]
    assert f"app.outbox.processed.{names}:1|c" in delivered.splitlines()
    assert f"app.outbox.send_duration.{names}:" in delivered
    lines = [line for packet in packets for line in packet.splitlines()]
    receiver = AUDIT_RECEIVER.replace(".", "_")
    assert any(
        line.startswith(f"app.outbox.receiver_duration.{names}.{receiver}:") for line in lines
    )
    assert any(line.startswith("app.outbox.claim_duration.outbox_RegionOutbox:") for line in lines)


def all_packets(server):
    """Every packet `server` receives until none comes for a quarter of a second."""
    packets = []
    server.settimeout(0.25)
    try:
        while True:
            packets.append(server.recv(65535).decode())
    except TimeoutError:
        return packets


# OpenTelemetry, read back through the SDK


@pytest.fixture
def otel_reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    install(OpenTelemetryMetrics(provider))
    yield reader
    provider.shutdown()


def otel_points(reader):
    """{(metric name, attributes): data point} of everything recorded so far."""
    data = reader.get_metrics_data()
    return {
        (metric.name, tuple(sorted(point.attributes.items()))): point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }


OTEL_REGION = (
    ("outbox.category", "AUDIT_EVENT"),
    ("outbox.scope", "ORGANIZATION"),
    ("outbox.table", "outbox.RegionOutbox"),
)


def test_opentelemetry_records_the_signals(otel_reader):
    send_lifecycle_signals()
    points = otel_points(otel_reader)
    assert points["outbox.saved", OTEL_REGION].value == 2
    assert points["outbox.processed", OTEL_REGION].value == 3
    assert points["outbox.processing_lag", OTEL_REGION].sum == 0.5
    assert points["outbox.send_duration", OTEL_REGION].count == 1
    assert points["outbox.failed", OTEL_REGION].value == 1
    assert points["outbox.dead_lettered", OTEL_REGION].value == 1
    assert points["outbox.leases_lost", OTEL_REGION[1:]].value == 1
    receiver = tuple(sorted((*OTEL_REGION, ("outbox.receiver", "app.receivers.audit"))))
    assert points["outbox.receiver_duration", receiver].sum == 0.015
    assert points["outbox.claim_duration", (("outbox.table", "outbox.RegionOutbox"),)].count == 1


@pytest.mark.django_db(databases=["default", "control"])
def test_opentelemetry_gauges_the_backlog(otel_reader):
    saved_backlog()
    record_backlog()
    points = otel_points(otel_reader)
    assert points["outbox.backlog.rows", OTEL_REGION[1:]].value == 3
    assert points["outbox.backlog.shards", OTEL_REGION[1:]].value == 2
    assert points["outbox.due_rows", OTEL_REGION[1:]].value == 3
    assert points["outbox.oldest_due_age", OTEL_REGION[1:]].value >= 0
    table = (("outbox.table", "outbox.RegionOutbox"),)
    assert points["outbox.gauges_read_timestamp", table].value > 0


def test_opentelemetry_gauges_stuck_receivers(otel_reader):
    table = (("outbox.table", "outbox.RegionOutbox"),)
    send_receivers_stuck(2)
    assert otel_points(otel_reader)["outbox.stuck_receivers", table].value == 2
    send_receivers_stuck(0)
    assert otel_points(otel_reader)["outbox.stuck_receivers", table].value == 0


@committing
def test_opentelemetry_end_to_end_save_and_drain(otel_reader):
    RegionOutboxFactory()
    drain_outboxes()
    points = otel_points(otel_reader)
    assert points["outbox.saved", OTEL_REGION].value == 1
    assert points["outbox.processed", OTEL_REGION].value == 1
    assert points["outbox.send_duration", OTEL_REGION].count == 1
    receiver = tuple(sorted((*OTEL_REGION, ("outbox.receiver", AUDIT_RECEIVER))))
    assert points["outbox.receiver_duration", receiver].count == 1
    assert points["outbox.claim_duration", (("outbox.table", "outbox.RegionOutbox"),)].count >= 1
