"""Drain processes as first-class (#46): each long-running drain records itself (host,
pid, kind, since, last beat, rows in the last minute, calls running and the longest) and
is listed alive by `outbox_status` and the dashboard until it stops beating; a drain
that stops cleanly removes its record at once; "no drain alive" when none is; the
Prometheus gauges of a drain that stopped beating are withdrawn.

The suite runs with OUTBOX_DRAIN_BEACON_SECONDS = 0: these tests beat by hand, run a
beacon they stop before they end, or turn it on in a subprocess."""

import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from outbox.engine import DrainWorker
from outbox.engine.slots import running_calls
from outbox.health.beacon import BEAT_FILE, DrainBeacon, live_drains, process_name
from outbox.metrics.prometheus import sweep_dead_processes
from outbox.models import OutboxDrainMinute, OutboxDrainProcess, RegionOutbox, ShardLease
from outbox.models.drains import CELERY, KEPT_MINUTES, LOOP, record_beat, record_minute
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.workers import Process, wait_until, worker_env

pytestmark = committing

DASHBOARD = "admin:outbox_dashboard"


def status() -> str:
    out = StringIO()
    call_command("outbox_status", stdout=out)
    return out.getvalue()


def a_drain(name="web-1:42", *, expires_in=30.0, **fields):
    host, pid = name.split(":")
    state = {"kind": CELERY, "rows_last_minute": 120, "calls_running": 2, **fields}
    record_beat("default", name, expires_in=expires_in, host=host, pid=int(pid), **state)


@pytest.fixture
def hung_call(calls):
    """Starts a drain of one shard whose receiver waits until the test ends."""
    release = threading.Event()
    inside = threading.Event()
    runners = []

    def start(shard=7, concurrency=1):
        RegionOutboxFactory(shard_identifier=shard)
        calls.during_call = lambda sender, kwargs: (inside.set(), release.wait(20))
        worker = DrainWorker([RegionOutbox], concurrency=concurrency)
        runner = threading.Thread(target=worker.run)
        runner.start()
        runners.append(runner)
        assert inside.wait(10), "the receiver was not called"

    yield start
    release.set()
    for runner in runners:
        runner.join(20)


# --- What the engine tells of its calls and rows ----------------------------------


@pytest.mark.parametrize("concurrency", [1, 2])
def test_the_calls_running_say_their_shard_and_how_long_they_have_run(hung_call, concurrency):
    def of_shard_7():
        return [call for call in running_calls() if call.shard.shard_identifier == 7]

    assert of_shard_7() == []
    hung_call(shard=7, concurrency=concurrency)
    time.sleep(0.3)
    [call] = of_shard_7()
    assert call.category is not None and not call.given_up
    assert 0.3 <= call.seconds < 10
    assert of_shard_7()[0].seconds > call.seconds  # it runs on


def test_a_call_given_up_at_the_timeout_is_listed_as_such_until_it_returns(calls, settings):
    settings.OUTBOX_RECEIVER_TIMEOUT_SECONDS = 0.3
    release = threading.Event()
    calls.during_call = lambda sender, kwargs: release.wait(20)
    RegionOutboxFactory(shard_identifier=5)

    def of_shard_5():
        return [call for call in running_calls() if call.shard.shard_identifier == 5]

    try:
        DrainWorker([RegionOutbox], concurrency=2).run()  # returns once it gave the call up
        [call] = of_shard_5()
        assert call.given_up and call.seconds >= 0.3
        DrainBeacon(LOOP, ["default"], every=10.0).beat()
        drain = OutboxDrainProcess.objects.get()
        assert drain.stuck_calls >= 1 and drain.calls_running >= 1
        assert drain.longest_call.endswith("/5, category AUDIT_EVENT, given up at the timeout")
    finally:
        release.set()
    wait_until(lambda: not of_shard_5(), timeout=10)


def test_rows_retired_count_every_finished_drain_of_the_process():
    before = DrainWorker.rows_retired()
    for shard in range(3):
        RegionOutboxFactory(shard_identifier=shard)
    DrainWorker([RegionOutbox]).run()
    assert DrainWorker.rows_retired() == before + 3


# --- The record: written by each beat, alive until its expiry ---------------------


def test_a_beat_records_rows_in_the_last_minute_and_the_longest_call(hung_call):
    beacon = DrainBeacon(LOOP, ["default", "control"], every=10.0)
    beacon.beat()  # the start: nothing retired yet
    for shard in range(3):
        RegionOutboxFactory(shard_identifier=shard)
    DrainWorker([RegionOutbox]).run()
    hung_call(shard=9)
    time.sleep(0.2)
    beacon.beat()
    for alias in ("default", "control"):  # every database it drains
        drain = OutboxDrainProcess.objects.using(alias).get()
        assert (drain.name, drain.pid, drain.kind) == (process_name(), os.getpid(), "loop")
        assert drain.rows_last_minute == 3
        assert drain.calls_running == 1 and drain.stuck_calls == 0
        assert drain.longest_call_seconds >= 0.2
        assert drain.longest_call.startswith("shard ") and "/9, category " in drain.longest_call


def test_beats_add_the_rows_retired_and_the_lag_they_saw_to_the_minute():
    beacon = DrainBeacon(LOOP, ["default"], every=10.0)
    other = DrainBeacon(LOOP, ["default"], every=10.0)  # a second drain process's
    beacon.beat()
    for shard in range(3):
        RegionOutboxFactory(shard_identifier=shard)
    DrainWorker([RegionOutbox]).run()
    waiting = RegionOutboxFactory(shard_identifier=9)
    RegionOutbox.objects.filter(pk=waiting.pk).update(
        date_added=timezone.now() - timedelta(seconds=40)
    )
    beacon.beat()
    other.beat()
    minutes = list(OutboxDrainMinute.objects.all())
    if len(minutes) == 2:  # the beats straddled a minute's end: sum them
        minutes = [
            OutboxDrainMinute(
                rows_retired=sum(m.rows_retired for m in minutes),
                lag_seconds=max(m.lag_seconds for m in minutes),
            )
        ]
    [minute] = minutes
    assert minute.rows_retired == 3 + 3  # each beacon adds its process's rows since it began
    assert 40 <= minute.lag_seconds < 60  # the waiting row's age, the oldest due
    assert not OutboxDrainMinute.objects.using("control").filter(rows_retired__gt=0).exists()


def test_minutes_past_the_kept_hour_and_a_half_are_deleted_by_the_next_record():
    now = timezone.now().replace(second=0, microsecond=0)
    record_minute("default", now - timedelta(minutes=KEPT_MINUTES + 1), 5, 0.0)
    record_minute("default", now - timedelta(minutes=KEPT_MINUTES - 1), 6, 0.0)
    record_minute("default", now, 7, 1.5)
    record_minute("default", now, 1, 0.5)  # a second drain's beat in the same minute
    kept = dict(OutboxDrainMinute.objects.values_list("minute", "rows_retired"))
    assert kept == {now - timedelta(minutes=KEPT_MINUTES - 1): 6, now: 8}
    assert OutboxDrainMinute.objects.get(minute=now).lag_seconds == 1.5


def last_beat():
    """The one record's last beat, or None: none yet, or SQLite's in-memory test database
    refused the read while the beacon's thread was writing (its shared cache locks the
    table instead of waiting)."""
    try:
        record = OutboxDrainProcess.objects.first()
    except OperationalError:
        if connection.vendor != "sqlite":
            raise
        return None
    return None if record is None else record.beat_at


def test_a_running_beacon_beats_on_and_deletes_its_record_as_it_stops():
    beacon = DrainBeacon(LOOP, ["default"], every=0.2).start()
    try:
        wait_until(lambda: last_beat() is not None, timeout=10)
        first = last_beat()
        while first is None:  # a read refused between the two looks
            first = last_beat()
        wait_until(lambda: (last_beat() or first) > first, timeout=10)
    finally:
        beacon.stop()
    assert not beacon.is_alive()
    assert not OutboxDrainProcess.objects.exists()


def test_a_drain_that_stops_beating_is_not_alive_past_its_expiry_and_the_next_beat_deletes_it():
    a_drain("gone:1", expires_in=0.5)
    assert [drain["name"] for drain in live_drains("default")] == ["gone:1"]
    wait_until(lambda: not live_drains("default"), timeout=5)
    assert OutboxDrainProcess.objects.filter(name="gone:1").exists()  # expired, still there
    a_drain("other:2")
    assert list(OutboxDrainProcess.objects.values_list("name", flat=True)) == ["other:2"]


# --- outbox_status and the dashboard ----------------------------------------------


def test_status_lists_the_live_drains_per_database_or_says_no_drain_alive():
    assert "default: no drain alive" in status()
    a_drain(longest_call_seconds=12.5, longest_call="shard ORGANIZATION/3", stuck_calls=1)
    for shard, holder in ((1, "web-1:42:7"), (2, "web-1:42:8"), (3, "web-1:421:7")):
        ShardLease.objects.create(
            outbox="outbox.regionoutbox",
            shard_scope=0,
            shard_identifier=shard,
            token=f"token-{shard}",
            holder=holder,  # host:pid:thread of the drain that claimed it
            expires_at=timezone.now() + timedelta(seconds=30),
        )
    text = status()
    assert "default: 1 drain(s) alive" in text and "control: no drain alive" in text
    [line] = [line for line in text.splitlines() if line.startswith("    drain ")]
    assert line.startswith("    drain web-1:42 (celery) up ")
    assert "120 rows in the last minute, 2 shard(s) held, 2 call(s) running" in line
    assert "the longest 12s (shard ORGANIZATION/3)" in line
    assert "1 given up at the timeout and still running" in line

    out = StringIO()
    call_command("outbox_status", "--json", stdout=out)
    tables = {table["database"]: table for table in json.loads(out.getvalue())}
    [drain] = tables["default"]["drains"]
    assert (drain["name"], drain["host"], drain["pid"], drain["kind"]) == (
        "web-1:42",
        "web-1",
        42,
        "celery",
    )
    assert drain["calls_running"] == 2 and drain["longest_call_seconds"] == 12.5
    assert drain["shards_held"] == 2
    assert 0 <= drain["beat_seconds_ago"] < 5 and tables["control"]["drains"] == []


def test_min_drains_fails_status_for_a_database_with_fewer_alive():
    a_drain()
    call_command("outbox_status", "--database", "default", "--min-drains", "1", stdout=StringIO())
    with pytest.raises(CommandError) as raised:
        call_command("outbox_status", "--min-drains", "1", stdout=StringIO())
    assert raised.value.returncode == 6
    assert "control: no drain process(es) alive, fewer than 1" in str(raised.value)
    assert "default:" not in str(raised.value)


def test_the_health_check_fails_with_fewer_drains_alive_than_asked():
    pytest.importorskip("health_check")
    from health_check.exceptions import ServiceUnavailable

    from outbox.health import check
    from outbox.health.thresholds import Thresholds
    from outbox.integrations.health_check import OutboxHealthCheck

    assert check() == []  # not asked: the drains are not read
    assert check(thresholds=Thresholds(min_drains=1)) == [
        "default: no drain process(es) alive, fewer than 1",
        "control: no drain process(es) alive, fewer than 1",
    ]
    a_drain()
    OutboxHealthCheck(min_drains=1, database="default").run()  # healthy: returns
    with pytest.raises(ServiceUnavailable, match="control: no drain process"):
        OutboxHealthCheck(min_drains=1).run()


def test_the_dashboard_lists_live_drains_and_highlights_a_long_call(admin_client, settings):
    settings.OUTBOX_DRAIN_BEACON_SECONDS = 10.0
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert '<p class="no-drain state-failing" data-table="outbox.RegionOutbox">' in page
    assert '<strong class="state">no drain alive</strong>' in page
    a_drain(longest_call_seconds=42.0, longest_call="shard ORGANIZATION/3, category X")
    a_drain("web-2:43", longest_call_seconds=1.0, longest_call="shard ORGANIZATION/4")
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert '<p class="no-drain state-failing" data-table="outbox.RegionOutbox">' not in page
    long_call = '<tr class="drain state-warning" data-drain="web-1:42">'
    assert long_call in page
    row = page.split(long_call)[1].split("</tr>")[0]
    assert ">celery<" in row and ">120<" in row
    assert '<td class="longest-call state">42 s: shard ORGANIZATION/3, category X</td>' in row
    assert '<tr class="drain" data-drain="web-2:43">' in page  # a short call: no colour
    # ControlOutbox lives in the other database, where no drain is alive.
    assert '<p class="no-drain state-failing" data-table="outbox.ControlOutbox">' in page

    a_drain(stuck_calls=1, longest_call_seconds=1.0)
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert '<tr class="drain state-failing" data-drain="web-1:42">' in page


def test_the_dashboard_draws_the_last_hours_rows_and_lag_per_minute(admin_client):
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "nothing recorded: no\n      drain has beaten in this hour." in page
    if timezone.now().second >= 55:  # the page is drawn in the minute written for
        time.sleep(6)
    now = timezone.now().replace(second=0, microsecond=0)
    record_minute("default", now - timedelta(minutes=2), 300, 0.2)
    record_minute("default", now - timedelta(minutes=1), 1200, 4.0)
    record_minute("default", now - timedelta(minutes=90), 99999, 600.0)  # not this hour
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    chart = page.split('<figure class="activity" data-table="outbox.RegionOutbox">')[1]
    chart = chart.split("</figure>")[0]
    assert "1500 rows retired, the busiest\n      minute 1200" in chart
    assert "up to 4 s" in chart and "in the last\n      minute" not in chart  # none this minute
    assert chart.count('<rect class="bar"') == 60
    bars = chart.split('<rect class="bar"')[1:]
    assert 'height="80.0"' in bars[58] and "1200 rows retired, lag 4 s" in bars[58]
    assert 'height="20.0"' in bars[57] and 'height="0.0"' in bars[0]
    assert '<polyline class="lag" points="575,76 585,0"' in chart
    # ControlOutbox's database recorded nothing.
    control = page.split('<figure class="activity" data-table="outbox.ControlOutbox">')[1]
    assert "nothing recorded" in control.split("</figure>")[0]


@server_database_only
def test_a_running_drain_records_its_rows_per_minute(tmp_path):
    drainer = drain_loop(tmp_path, beat_seconds=0.5)
    try:
        for shard in range(20):
            RegionOutboxFactory(shard_identifier=shard)
        retired = OutboxDrainMinute.objects.aggregate(n=Sum("rows_retired"))
        wait_until(
            lambda: (OutboxDrainMinute.objects.aggregate(n=Sum("rows_retired"))["n"] or 0) >= 20,
            timeout=30,
            message=drainer.output(),
        )
        assert retired  # read while it ran
    finally:
        drainer.stop()
    assert OutboxDrainMinute.objects.aggregate(n=Sum("rows_retired"))["n"] == 20


def test_the_dashboard_says_when_drains_are_not_recorded(admin_client):
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "no drain alive" not in page
    assert "Drain processes are not recorded here" in page


# --- Real drain processes -------------------------------------------------------------


def drain_loop(tmp_path, beat_seconds, name="drain", **settings):
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop", "--settings=tests.settings"]
    env = worker_env(OUTBOX_DRAIN_BEACON_SECONDS=beat_seconds, **settings)
    return Process(args, env, tmp_path / f"{name}.log")


def listed(pid: int) -> bool:
    return f":{pid} (loop) up " in status()


@server_database_only
def test_a_killed_drain_is_listed_until_its_beats_expire_then_no_drain_alive(tmp_path):
    drainer = drain_loop(tmp_path, beat_seconds=0.5)
    try:
        wait_until(lambda: listed(drainer.pid), timeout=30, message=drainer.output())
        # Its first beat records it on one database, then on the other: both, in time.
        wait_until(
            lambda: (
                "default: 1 drain(s) alive" in (text := status())
                and "control: 1 drain(s) alive" in text
            ),
            timeout=10,
        )
        drainer.popen.send_signal(signal.SIGKILL)
        drainer.popen.wait(10)
        killed = time.monotonic()
        # Nothing deleted it: only its expiry ends it (three beats, 1.5 s).
        assert OutboxDrainProcess.objects.filter(pid=drainer.pid).exists()
        wait_until(lambda: "default: no drain alive" in status(), timeout=10)
        assert time.monotonic() - killed < 5
        assert "control: no drain alive" in status()
    finally:
        drainer.stop()


@server_database_only
def test_a_drain_stopped_by_sigterm_deletes_its_record_at_once(tmp_path):
    drainer = drain_loop(tmp_path, beat_seconds=30.0)  # its record would live 90 s
    try:
        for alias in ("default", "control"):
            records = OutboxDrainProcess.objects.using(alias).filter(pid=drainer.pid)
            wait_until(records.exists, timeout=30, message=drainer.output())
        assert listed(drainer.pid)
        drainer.terminate()
    finally:
        drainer.stop()
    assert drainer.popen.returncode == 0, drainer.output()
    assert not OutboxDrainProcess.objects.using("default").exists()
    assert not OutboxDrainProcess.objects.using("control").exists()
    assert "default: no drain alive" in status()


def test_the_gauges_of_a_drain_whose_beat_expired_are_withdrawn(tmp_path):
    """A beat file expired: that process's live gauges go at the next sweep, though its
    process id still runs (this one's: a drain frozen as a whole); one still beating
    keeps them."""
    frozen, beating = os.getpid(), os.getppid()
    for pid in (frozen, beating):
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
        (tmp_path / BEAT_FILE.format(pid=pid)).touch()
    expired, later = time.time() - 1, time.time() + 30
    os.utime(tmp_path / BEAT_FILE.format(pid=frozen), (expired, expired))
    os.utime(tmp_path / BEAT_FILE.format(pid=beating), (later, later))
    assert sweep_dead_processes(str(tmp_path)) == [frozen]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [f"gauge_livesum_{beating}.db", BEAT_FILE.format(pid=beating)]
    )


def metrics_loop(tmp_path, name, directory, beat_seconds):
    """A drain loop serving /metrics of every process of `directory`; its port."""
    from tests.test_metrics_port import free_port

    port = free_port()
    env = worker_env(
        OUTBOX_DRAIN_BEACON_SECONDS=beat_seconds,
        OUTBOX_METRICS="prometheus",
        OUTBOX_LOOP_INTERVAL_SECONDS=0.2,
        OUTBOX_CONCURRENCY=4,  # the receiver timeout applies to calls on slot threads
        OUTBOX_RECEIVER_TIMEOUT_SECONDS=1,
    )
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
    drainer = Process([*args, "--metrics-port", str(port)], env, tmp_path / f"{name}.log")
    drainer.wait_for_output("serving Prometheus metrics")
    return drainer, port


@server_database_only
def test_a_frozen_drains_gauges_go_once_it_stops_beating(tmp_path):
    """A drain loop stopped with SIGSTOP (its process still runs, nothing of it beats):
    once its beat expired, the /metrics another drain serves no longer shows its stuck
    call. Without its beat it would stay shown for as long as the process exists."""
    from tests.test_metrics_processes import stuck

    directory = tmp_path / "prometheus"
    directory.mkdir()
    frozen, frozen_port = metrics_loop(tmp_path, "frozen", directory, beat_seconds=0.5)
    served = None
    try:
        RegionOutboxFactory(shard_identifier=1, payload={"hang": 30})
        frozen.wait_for_output("given up, its thread is stuck")
        wait_until(lambda: stuck(frozen_port) == 1, timeout=10, message=frozen.output())
        frozen.popen.send_signal(signal.SIGSTOP)
        served, port = metrics_loop(tmp_path, "served", directory, beat_seconds=0)
        wait_until(lambda: stuck(port) == 0, timeout=15, message=served.output())
        assert frozen.popen.poll() is None  # it runs, frozen
        assert not list(directory.glob(f"gauge_live*_{frozen.pid}.db"))
    finally:
        frozen.popen.send_signal(signal.SIGKILL)
        frozen.popen.wait(10)
        if served is not None:
            served.stop()
        RegionOutbox.objects.all().delete()
