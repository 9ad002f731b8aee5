"""`drain_outboxes --metrics-port PORT`: the drain process serves Prometheus' /metrics
itself while it runs (prometheus_client's own server; with PROMETHEUS_MULTIPROC_DIR the
values of every process of that directory) and frees the port when it ends. A port out
of range, a port in use, an address not of this host or OUTBOX_METRICS that is not
Prometheus is refused with a CommandError (exit status 1) before anything is delivered."""

import io
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest
from django.core.management import CommandError, call_command
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import outbox.metrics
import outbox.metrics.backlog
from outbox.engine import DrainWorker
from outbox.metrics.prometheus import PrometheusMetrics
from outbox.models import RegionOutbox
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.testapp.models import Delivery
from tests.workers import ROOT, Process, wait_until, worker_env

pytestmark = committing

TABLE = "outbox.RegionOutbox"
LABELS = {"table": TABLE, "scope": "ORGANIZATION", "category": "AUDIT_EVENT"}


def free_port() -> int:
    """A port nothing listens on now: the one the kernel picks for port 0."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


def processed(port: int) -> float | None:
    """The drain's `outbox_processed_total` of RegionOutbox, over its scopes and
    categories, as /metrics shows it (None: no such sample)."""
    values = [
        sample.value
        for family in text_string_to_metric_families(scrape(port))
        for sample in family.samples
        if sample.name == "outbox_processed_total" and sample.labels.get("table") == TABLE
    ]
    return sum(values) if values else None


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return False
    return True


# As an operator runs it: a real `drain_outboxes --loop` process.


def drain_process(tmp_path, name: str, *args: str, **env: str) -> Process:
    environment = worker_env(OUTBOX_METRICS="prometheus", OUTBOX_LOOP_INTERVAL_SECONDS=0.2)
    environment.update(env)
    command = [sys.executable, "-m", "django", "drain_outboxes", *args]
    return Process(command, environment, tmp_path / f"{name}.log")


def drain_loop(tmp_path, port: int, **env: str) -> Process:
    drainer = drain_process(tmp_path, "loop", "--loop", "--metrics-port", str(port), **env)
    drainer.wait_for_output(f"serving Prometheus metrics at http://127.0.0.1:{port}/metrics")
    return drainer


def stopped(drainer: Process, port: int) -> None:
    """SIGTERM: the loop ends as asked (exit status 0) and its port is free again."""
    drainer.terminate()
    assert drainer.popen.returncode == 0, drainer.output()
    assert not listening(port), drainer.output()
    assert "Traceback" not in drainer.output()


@server_database_only
def test_a_drain_loop_serves_its_metrics_until_it_stops(tmp_path):
    port = free_port()
    drainer = drain_loop(tmp_path, port)
    try:
        assert "outbox_claim_duration_seconds" in scrape(port)  # its claims, while idle
        RegionOutboxFactory(shard_identifier=1)
        wait_until(lambda: Delivery.objects.exists(), timeout=20, message=drainer.output())
        wait_until(lambda: processed(port) == 1, timeout=10, message=scrape(port))
        assert not RegionOutbox.objects.exists()
        stopped(drainer, port)
    finally:
        drainer.stop()


@server_database_only
def test_with_a_multiprocess_directory_it_serves_every_process(tmp_path):
    """One message delivered by a one-shot drain that has exited, one by the loop: the
    loop's /metrics counts both, read from the directory's files."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    RegionOutboxFactory(shard_identifier=1)
    once = drain_process(tmp_path, "once", **env)
    try:
        assert once.popen.wait(120) == 0, once.output()
    finally:
        once.stop()
    assert Delivery.objects.count() == 1 and not RegionOutbox.objects.exists()
    port = free_port()
    drainer = drain_loop(tmp_path, port, **env)
    try:
        assert processed(port) == 1  # the other process's, before the loop delivered any
        RegionOutboxFactory(shard_identifier=2)
        wait_until(lambda: Delivery.objects.count() == 2, timeout=20, message=drainer.output())
        wait_until(lambda: processed(port) == 2, timeout=10, message=scrape(port))
        stopped(drainer, port)
    finally:
        drainer.stop()


def test_a_port_in_use_ends_the_process_with_a_command_error_not_a_traceback(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = worker_env(OUTBOX_METRICS="prometheus")
        command = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
        result = subprocess.run(
            [*command, "--metrics-port", str(port)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port} is in use by another process" in result.stderr
    assert "Traceback" not in result.stderr


# In this process: the command as call_command runs it, on every database.


@pytest.fixture
def registry(settings):
    """Prometheus metrics recording into a registry of the test's own."""
    settings.OUTBOX_METRICS = "prometheus"
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()
    registry = CollectorRegistry()
    outbox.metrics.install(PrometheusMetrics(registry))
    yield registry
    outbox.metrics.uninstall()
    outbox.metrics.backlog._reported.clear()


def test_the_command_serves_the_installed_registry_and_frees_the_port(registry):
    RegionOutboxFactory(shard_identifier=1)
    port = free_port()
    seen = []
    ended = threading.Event()

    def scrape_then_stop():
        """While the command runs: scrape until the delivery shows, then stop the loop."""
        while not ended.wait(0.1):
            try:
                if listening(port) and processed(port) == 1:
                    seen.append(scrape(port))
                    DrainWorker.stop_all()
                    return
            except OSError:  # closed meanwhile: the command ended
                pass

    scraper = threading.Thread(target=scrape_then_stop)
    scraper.start()
    out = io.StringIO()
    args = ["--loop", "--max-seconds", "30", "--progress-every", "0"]
    try:
        call_command("drain_outboxes", *args, "--metrics-port", str(port), stdout=out)
    finally:
        ended.set()
        scraper.join(10)
    assert f"serving Prometheus metrics at http://127.0.0.1:{port}/metrics" in out.getvalue()
    assert seen and "outbox_processed_total{" in seen[0]  # stopped at once, not at 30 s
    assert registry.get_sample_value("outbox_processed_total", LABELS) == 1
    assert not listening(port)
    assert not RegionOutbox.objects.exists()


def refused(*args, **options) -> str:
    with pytest.raises(CommandError) as raised:
        call_command("drain_outboxes", *args, stdout=io.StringIO(), stderr=io.StringIO(), **options)
    return str(raised.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--metrics-port", "0"], "--metrics-port must be a whole number from 1 to 65535, not 0"),
        (["--metrics-port", "-1"], "--metrics-port must be a whole number from 1 to 65535, not -1"),
        (["--metrics-port", "65536"], "--metrics-port must be a whole number from 1 to 65535"),
        (["--metrics-address", "0.0.0.0"], "--metrics-address needs --metrics-port"),
        (
            ["--metrics-port", "9464", "--metrics-address", "192.0.2.1"],
            "cannot listen on 192.0.2.1",
        ),
    ],
)
def test_refused_before_anything_is_delivered(registry, calls, args, words):
    RegionOutboxFactory(shard_identifier=1)
    assert words in refused("--loop", *args)
    assert calls.calls == [] and RegionOutbox.objects.count() == 1


def test_a_port_out_of_range_given_as_a_keyword_is_refused(registry):
    assert "--metrics-port must be a whole number from 1 to 65535" in refused(metrics_port=70000)


def test_a_port_in_use_is_refused_with_what_to_do(registry, calls):
    RegionOutboxFactory(shard_identifier=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refused("--loop", "--metrics-port", str(port))
    assert message == (
        f"--metrics-port {port}: 127.0.0.1:{port} is in use by another process; choose a "
        "free port (or --metrics-address)."
    )
    assert calls.calls == [] and RegionOutbox.objects.count() == 1


@pytest.mark.parametrize("choice", [None, "statsd"])
def test_metrics_other_than_prometheus_are_refused_naming_the_setting(settings, calls, choice):
    settings.OUTBOX_METRICS = choice
    RegionOutboxFactory(shard_identifier=1)
    port = free_port()
    message = refused("--loop", "--metrics-port", str(port))
    assert f'set OUTBOX_METRICS = "prometheus" (it is {choice!r})' in message
    assert not listening(port)
    assert calls.calls == [] and RegionOutbox.objects.count() == 1
