"""Wake-up of an idle `drain_outboxes --loop` (PostgreSQL LISTEN/NOTIFY), and its
fallbacks: a lost notification or a dropped LISTEN connection only delays delivery to the
next poll, and other databases only poll.

The loops run as real processes with a long poll interval, so only a notification can
explain a fast delivery. Times compare `time.monotonic()` of this process with the one
the worker's receiver journals (`Delivery.started`): one clock on one machine.
"""

import sys
import threading
import time

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection, connections, transaction

from outbox import outbox_context
from outbox.backends.postgresql.notify import (
    APPLICATION_NAME,
    TRIGGER,
    Listener,
    channel,
    sync_triggers,
    trigger_channel,
)
from outbox.backends.select import listeners
from outbox.engine import DrainWorker
from outbox.engine.worker import StopEvent, Waiter
from outbox.models import ControlOutbox, OutboxBase, RegionOutbox
from tests.conftest import committing
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Delivery
from tests.workers import Process, wait_until, worker_env

pytestmark = committing

postgres_only = pytest.mark.skipif(
    django_settings.TEST_DB != "postgres", reason="LISTEN/NOTIFY is PostgreSQL's"
)


def write(object_identifier: int, shard: int = 1) -> float:
    """One message, its own transaction, left to the drain; when its COMMIT returned."""
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            category=Category.ORGANIZATION_UPDATE,
            object_identifier=object_identifier,
            payload={"n": object_identifier},
        ).save()
    return time.monotonic()


def write_in_thread(object_identifier: int) -> None:
    try:
        write(object_identifier)
    finally:
        connections.close_all()  # this thread's own connections


def listener_pids(alias: str = "default") -> list[int]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            [APPLICATION_NAME],
        )
        return [row[0] for row in cursor.fetchall()]


def delivered_after(object_identifier: int, committed: float, timeout: float) -> float:
    """Seconds from the commit to the receiver's start in the worker."""

    def journaled():
        return Delivery.objects.filter(object_identifier=object_identifier).exists()

    wait_until(journaled, timeout=timeout, interval=0.01, message=f"{object_identifier} late")
    return Delivery.objects.get(object_identifier=object_identifier).started - committed


@pytest.fixture
def idle_loop(tmp_path):
    """Start `drain_outboxes --loop` with the given poll interval; wait until it listens
    and has gone idle. Stopped at the end of the test."""
    started = []

    def start(interval: float) -> Process:
        args = [sys.executable, "-m", "django", "drain_outboxes", "--loop", "-v", "2"]
        env = worker_env(OUTBOX_LOOP_INTERVAL_SECONDS=interval)
        process = Process(args, env, tmp_path / f"drain-{len(started)}.log")
        started.append(process)
        wait_until(lambda: listener_pids(), timeout=30, message="the loop never listened")
        time.sleep(0.3)  # its first round is over: idle
        return process

    yield start
    for process in started:
        process.stop()


@postgres_only
def test_a_message_written_without_flush_wakes_an_idle_loop(idle_loop):
    drainer = idle_loop(interval=30.0)
    latencies = []
    for n in range(5):
        latencies.append(delivered_after(n, write(n, shard=n), timeout=5))
        time.sleep(0.1)
    assert max(latencies) < 3.0, (latencies, drainer.output())
    assert not RegionOutbox.objects.exists()


def heard_before(listener: Listener, mark: str, timeout: float) -> list[str]:
    """Notify the listener's channel with a payload of the test's own, `mark`; the
    payloads of the notifications the listener received before it. PostgreSQL delivers
    notifications in the order their transactions committed, so these are exactly those
    committed before the mark and not yet read."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [listener.channels[0], mark])
    before = []
    for notification in listener.connection.notifies(timeout=timeout):
        if notification.payload == mark:
            return before
        before.append(notification.payload)
    raise AssertionError(f"the notification {mark!r} never came")


@postgres_only
def test_a_lost_notification_only_delays_delivery_to_the_next_poll(idle_loop):
    drainer = idle_loop(interval=2.0)
    # A listener of the test's own sees what the loop could have heard.
    heard = Listener("default", [channel(RegionOutbox)])
    heard.connect()
    table = connection.ops.quote_name(RegionOutbox._meta.db_table)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER {TRIGGER}")
        try:
            committed = write(1)
            assert delivered_after(1, committed, timeout=10) < 2.0 + 2.0, drainer.output()
            # The trigger was off: the write's commit notified nobody, the poll found it.
            # (Asked only now: the test's own notification wakes the loop too.)
            assert heard_before(heard, "trigger off", timeout=10) == []
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER {TRIGGER}")
        # The trigger back, the next write notifies (once) and wakes the loop again.
        assert delivered_after(2, write(2), timeout=10) < 2.0 + 2.0
        assert heard_before(heard, "trigger on", timeout=10) == [""]
    finally:
        heard.close()


@postgres_only
def test_a_dropped_listen_connection_is_replaced_and_still_wakes_the_loop(idle_loop):
    drainer = idle_loop(interval=30.0)
    [before] = listener_pids()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [before])
    wait_until(lambda: listener_pids() not in ([], [before]), timeout=10, message="no reconnect")
    time.sleep(0.3)  # the round that follows a reconnect is over
    assert delivered_after(1, write(1), timeout=10) < 3.0, drainer.output()
    assert "lost its connection" in drainer.output()
    # A write while the listener is away is caught by the round after the reconnect.
    [again] = listener_pids()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [again])
    assert delivered_after(2, write(2), timeout=10) < 3.0, drainer.output()


@postgres_only
def test_the_stock_tables_have_their_trigger_after_migrate():
    assert trigger_channel("default", RegionOutbox) == channel(RegionOutbox)
    assert trigger_channel("control", ControlOutbox) == channel(ControlOutbox)


@pytest.fixture
def custom_outbox():
    """A custom outbox table, installed in the app registry like a project's own."""

    class WakeupOutbox(OutboxBase):
        class Meta(OutboxBase.Meta):
            app_label = "testapp"

    with connection.schema_editor() as editor:
        editor.create_model(WakeupOutbox)
    try:
        yield WakeupOutbox
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(WakeupOutbox)
        del apps.all_models["testapp"]["wakeupoutbox"]
        apps.clear_cache()


@postgres_only
def test_migrate_gives_a_custom_outbox_table_its_trigger_and_the_setting_removes_it(
    custom_outbox, settings
):
    assert trigger_channel("default", custom_outbox) is None
    call_command("migrate", verbosity=0)
    assert trigger_channel("default", custom_outbox) == channel(custom_outbox)
    assert sync_triggers("default") == []  # idempotent: nothing left to change
    settings.OUTBOX_NOTIFY = False
    call_command("migrate", verbosity=0)
    assert trigger_channel("default", custom_outbox) is None
    assert trigger_channel("default", RegionOutbox) is None
    settings.OUTBOX_NOTIFY = True
    call_command("migrate", verbosity=0)
    assert trigger_channel("default", RegionOutbox) == channel(RegionOutbox)


def test_channel_names_fit_postgresql():
    class Meta:
        db_table = "x" * 80

    long = type("Long", (), {"_meta": Meta})
    assert len(channel(long)) <= 63
    assert channel(RegionOutbox) == f"outbox_{RegionOutbox._meta.db_table}"


@postgres_only
def test_a_waiter_wakes_on_a_commit_to_its_table_only():
    stop = StopEvent()
    with Waiter([RegionOutbox], None, stop) as waiter:
        assert not waiter.wait(0.2)  # nothing written: the timeout
        threading.Timer(0.2, write_in_thread, args=(1,)).start()
        started = time.monotonic()
        assert waiter.wait(10)
        assert time.monotonic() - started < 5
        with pytest.raises(ZeroDivisionError), outbox_context(transaction.atomic()):
            write(2)
            raise ZeroDivisionError
        assert not waiter.wait(0.3)  # a rolled-back write notifies nobody
        ControlOutbox.objects.using("control").create(
            region_name="us",
            shard_scope=Scope.USER,
            shard_identifier=1,
            category=Category.USER_UPDATE,
            object_identifier=1,
        )
        assert not waiter.wait(0.3)  # another table's write does not wake it


@postgres_only
def test_a_loop_that_hears_every_write_waits_right_after_a_round_that_delivered(settings):
    """No second look before the wait: a write committed after a round's last claim
    ends the wait at once, so each message costs the loop one round."""
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 30.0
    rounds = []
    worker = DrainWorker([RegionOutbox], loop=True, on_round=lambda: rounds.append(1))
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_until(lambda: rounds, timeout=30, message="no first round")
        for n in range(3):
            before = len(rounds)
            write(n, shard=n)
            wait_until(lambda: not RegionOutbox.objects.exists(), timeout=5)  # not 30 s
            time.sleep(0.3)  # another round would have run by now
            assert len(rounds) == before + 1
    finally:
        worker.request_stop()
        runner.join(30)
    assert not runner.is_alive()


def test_a_stop_request_ends_an_idle_wait_at_once(settings):
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 30.0
    worker = DrainWorker(loop=True)
    threading.Timer(0.5, worker.request_stop).start()
    started = time.monotonic()
    outcome = worker.run()
    assert time.monotonic() - started < 3.0
    assert not outcome.abandoned


def channels_by_database() -> dict[str, list[str]]:
    """The channels each database's listener would LISTEN on."""
    return {alias: listener.channels for alias, listener in listeners(None, None).items()}


def test_other_databases_and_the_setting_off_only_poll(settings):
    listening = channels_by_database()
    if django_settings.TEST_DB == "postgres":
        assert listening == {
            "default": [channel(RegionOutbox)],
            "control": [channel(ControlOutbox)],
        }
    else:
        assert listening == {}
    settings.OUTBOX_NOTIFY = False
    assert channels_by_database() == {}
    stop = StopEvent()
    with Waiter(None, None, stop) as waiter:
        started = time.monotonic()
        assert not waiter.wait(0.2)
        assert 0.15 < time.monotonic() - started < 2.0


@postgres_only
def test_the_listener_connects_on_its_own_connection():
    listener = Listener("default", [channel(RegionOutbox)])
    listener.connect()
    try:
        assert listener.backend_pid in listener_pids()
        assert listener.backend_pid != connection.connection.info.backend_pid
        assert listener.take() == 0
    finally:
        listener.close()


@postgres_only
def test_a_resume_wakes_an_idle_loop(idle_loop):
    """A message written to a paused scope wakes the loop, which claims nothing; the
    resume wakes it again, and the message is delivered long before the next poll."""
    drainer = idle_loop(interval=30.0)
    call_command("outbox_pause", "pause", "--scope", "ORGANIZATION", "--no-audit")
    write(1)
    time.sleep(1.0)  # heard and not claimed: paused
    assert not Delivery.objects.exists(), drainer.output()
    call_command("outbox_pause", "resume", "--scope", "ORGANIZATION", "--no-audit")
    resumed = time.monotonic()
    assert delivered_after(1, resumed, timeout=10) < 3.0, drainer.output()
