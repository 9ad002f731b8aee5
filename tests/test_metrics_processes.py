"""Prometheus' multiprocess mode with real drain processes: a drain whose receiver call is
stuck past OUTBOX_RECEIVER_TIMEOUT_SECONDS counts it in `outbox_stuck_receivers`; once
that process is gone, the `/metrics` of the processes still running no longer counts it,
whether it exited (it withdraws its own gauges) or was killed (the serving process
withdraws them at its next scrape). Its counters stay counted."""

import signal
import sys

from prometheus_client.parser import text_string_to_metric_families

from outbox.models import RegionOutbox
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.test_metrics_port import free_port, scrape
from tests.workers import Process, wait_until, worker_env

pytestmark = [committing, server_database_only]

TABLE = "outbox.RegionOutbox"
HANG_SECONDS = 6  # the stuck call's: past the receiver timeout, short of the test's end


def samples(port: int, name: str) -> dict[str, float]:
    """{table: value} of one metric as /metrics on `port` shows it."""
    return {
        sample.labels.get("table", ""): sample.value
        for family in text_string_to_metric_families(scrape(port))
        for sample in family.samples
        if sample.name == name
    }


def stuck(port: int) -> float:
    """`outbox_stuck_receivers` of RegionOutbox (0 when no process shows one)."""
    return samples(port, "outbox_stuck_receivers").get(TABLE, 0.0)


def failed(port: int) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(scrape(port))
        for sample in family.samples
        if sample.name == "outbox_failed_total" and sample.labels.get("table") == TABLE
    )


def stuck_drain(tmp_path, name: str, directory, shard: int):
    """A drain loop serving /metrics whose one call (to `shard`) is stuck; its port, and
    `outbox_stuck_receivers` as its /metrics showed it before that call."""
    port = free_port()
    env = worker_env(
        OUTBOX_METRICS="prometheus",
        OUTBOX_LOOP_INTERVAL_SECONDS=0.2,
        OUTBOX_CONCURRENCY=4,  # the receiver timeout applies to calls on slot threads
        OUTBOX_RECEIVER_TIMEOUT_SECONDS=1,
        OUTBOX_GRACEFUL_TIMEOUT_SECONDS=1,
    )
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    command = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
    drainer = Process([*command, "--metrics-port", str(port)], env, tmp_path / f"{name}.log")
    try:
        drainer.wait_for_output(f"serving Prometheus metrics at http://127.0.0.1:{port}/metrics")
        before = stuck(port)
        RegionOutboxFactory(shard_identifier=shard, payload={"hang": HANG_SECONDS})
        drainer.wait_for_output("given up, its thread is stuck")
    except BaseException:
        drainer.stop()
        raise
    return drainer, port, before


def test_an_exited_drain_no_longer_counts_its_stuck_call(tmp_path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    first, first_port, _ = stuck_drain(tmp_path, "first", directory, shard=1)
    try:
        wait_until(lambda: stuck(first_port) == 1, timeout=10, message=first.output())
        first.terminate()  # the call still hangs: it ends with its thread still running
    finally:
        first.stop()
    RegionOutbox.objects.filter(shard_identifier=1).delete()  # not retried by the second
    second, port, before = stuck_drain(tmp_path, "second", directory, shard=2)
    try:
        assert before == 0  # the exited drain's stuck call is not shown
        wait_until(lambda: stuck(port) >= 1, timeout=10, message=second.output())
        assert stuck(port) == 1  # its own call only, not the exited drain's too
        assert failed(port) == 2  # both given-up calls stay counted
        assert not list(directory.glob(f"gauge_live*_{first.pid}.db")), first.output()
    finally:
        second.stop()
        RegionOutbox.objects.all().delete()


def test_a_killed_drains_stuck_call_is_withdrawn_at_the_next_scrape(tmp_path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    first, first_port, _ = stuck_drain(tmp_path, "first", directory, shard=1)
    try:
        wait_until(lambda: stuck(first_port) == 1, timeout=10, message=first.output())
        first.popen.send_signal(signal.SIGKILL)  # no exit hook runs
        first.popen.wait(10)
    finally:
        first.stop()
    RegionOutbox.objects.filter(shard_identifier=1).delete()
    assert list(directory.glob(f"gauge_live*_{first.pid}.db"))  # left behind
    second, port, before = stuck_drain(tmp_path, "second", directory, shard=2)
    try:
        assert before == 0
        wait_until(lambda: stuck(port) >= 1, timeout=10, message=second.output())
        assert stuck(port) == 1
        assert not list(directory.glob(f"gauge_live*_{first.pid}.db"))
    finally:
        second.stop()
        RegionOutbox.objects.all().delete()
