"""Status, thresholds, the health check and the drain loop's heartbeat: what monitoring
reads."""

import io
import json
import logging
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from outbox.health import Thresholds, backlog, check
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.workers import worker_env

pytestmark = committing


def status_json(*args):
    out = io.StringIO()
    call_command("outbox_status", "--json", *args, stdout=out)
    return {table["table"]: table for table in json.loads(out.getvalue())}


@pytest.fixture
def backlog_rows():
    """Shard 1: a row due for 10 minutes; shard 2: a dead letter; shard 3: a dead
    worker's expired lease; shard 4: a row failing 4 times."""
    old = timezone.now() - timedelta(minutes=10)
    RegionOutboxFactory(shard_identifier=1)
    RegionOutbox.objects.filter(shard_identifier=1).update(date_added=old, scheduled_for=old)
    RegionOutboxFactory(shard_identifier=2)
    RegionOutbox.objects.filter(shard_identifier=2).update(
        dead_at=timezone.now(), attempts=3, last_error="RuntimeError: poison"
    )
    RegionOutboxFactory(shard_identifier=4)
    RegionOutbox.objects.filter(shard_identifier=4).update(
        attempts=4, last_error="ValueError: flaky\n"
    )
    ShardLease.objects.create(
        outbox="outbox.regionoutbox",
        shard_scope=0,
        shard_identifier=3,
        token="dead-worker",
        holder="gone:1",
        expires_at=timezone.now() - timedelta(seconds=5),
    )


def test_status_reports_lag_dead_letters_lease_states_and_worst_shards(backlog_rows):
    region = status_json()["outbox.RegionOutbox"]
    assert (region["rows"], region["dead_letters"], region["expired_shards"]) == (2, 1, 1)
    assert 590 <= region["lag_seconds"] <= 700  # the oldest due row's age
    [scope] = region["scopes"]
    assert scope["scope"] == "ORGANIZATION"
    assert (scope["rows"], scope["shards"], scope["dead_letters"]) == (2, 2, 1)
    assert (scope["expired_shards"], scope["held_shards"]) == (1, 0)
    worst = [(shard["shard"], shard["attempts"]) for shard in region["worst_shards"]]
    assert worst == [("0/4", 4), ("0/2", 3)]
    assert region["worst_shards"][0]["last_error"].startswith("ValueError: flaky")


def test_thresholds_exit_6_naming_what_passed_them(backlog_rows):
    status_json("--max-lag", "3600", "--max-dead", "1", "--max-expired", "1")  # all within
    with pytest.raises(CommandError) as failed:
        status_json("--max-lag", "60", "--max-dead", "0")
    assert failed.value.returncode == 6
    assert "lag 6" in str(failed.value) and "1 dead letter(s), over 0" in str(failed.value)
    with pytest.raises(CommandError, match="expired lease") as failed:
        call_command("outbox_status", "--max-expired", "0", stdout=io.StringIO())
    assert failed.value.returncode == 6


def test_bad_threshold_and_unknown_database_are_command_errors():
    with pytest.raises(CommandError, match="--max-lag must not be negative"):
        call_command("outbox_status", "--max-lag", "-1", stdout=io.StringIO())
    with pytest.raises(CommandError, match="Unknown database 'nosuch'"):
        call_command("outbox_status", "--database", "nosuch", stdout=io.StringIO())


def test_text_output_lists_scopes_and_worst_shards(backlog_rows):
    out = io.StringIO()
    call_command("outbox_status", stdout=out)
    text = out.getvalue()
    assert "1 dead" in text and "expired 1" in text
    assert "worst: shard 0/4 (ORGANIZATION), 4 attempts: ValueError: flaky" in text


def test_health_check_function_and_backlog_line(backlog_rows):
    assert check() == []  # no thresholds, nothing to report
    found = check(thresholds=Thresholds(max_lag_seconds=60, max_dead=0, max_expired=0))
    assert len(found) == 3
    assert backlog().startswith("2 rows (2 due) in 2 shards, lag 6")
    assert backlog().endswith(", 1 dead")


def test_django_health_check_plugin_fails_past_a_threshold(backlog_rows):
    pytest.importorskip("health_check")
    from health_check.exceptions import ServiceUnavailable

    from outbox.integrations.health_check import OutboxHealthCheck

    OutboxHealthCheck(max_lag_seconds=3600).run()  # healthy: returns
    with pytest.raises(ServiceUnavailable, match="dead letter"):
        OutboxHealthCheck(max_dead=0).run()


def test_the_loop_logs_a_heartbeat_with_backlog_and_lag_then_a_summary(settings, caplog):
    settings.OUTBOX_HEARTBEAT_SECONDS = 0.2
    RegionOutboxFactory(shard_identifier=9)
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="outbox.engine"):
        call_command("drain_outboxes", "--loop", "--max-seconds", "0.9", "-v", "2", stdout=out)
    events = [(getattr(r, "event", ""), r.getMessage()) for r in caplog.records]
    beats = [message for event, message in events if event == "outbox.heartbeat"]
    assert len(beats) >= 2, beats
    assert "1 rows retired" in beats[-1] and "backlog 0 rows (0 due) in 0 shards" in beats[-1]
    assert "outbox drain alive" in out.getvalue()
    assert any(event == "outbox.drain_done" for event, _ in events)


def test_verbosity_zero_prints_nothing_on_success():
    RegionOutboxFactory(shard_identifier=9)
    out = io.StringIO()
    call_command("drain_outboxes", "-v", "0", stdout=out)
    assert out.getvalue() == ""
    assert not RegionOutbox.objects.exists()


@server_database_only  # a second process needs a database it can reach
def test_status_command_exit_status_in_a_real_process(backlog_rows):
    result = subprocess.run(
        [sys.executable, "-m", "django", "outbox_status", "--max-dead", "0"],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 6, result.stderr
    assert "dead letter" in result.stderr


@server_database_only
def test_a_killed_worker_shows_as_expired_in_outbox_status_and_the_admin(tmp_path, admin_client):
    """kill -9 a real `drain_outboxes --loop` in the middle of a slow receiver: once its
    lease runs out, status and admin both call the shard expired (stuck), not held."""
    from django.urls import reverse

    from tests.testapp.models import Delivery
    from tests.workers import Process, wait_until

    RegionOutboxFactory(shard_identifier=7)
    env = worker_env(receiver_delay=30.0, OUTBOX_LEASE_SECONDS=1.0)
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
    drainer = Process(args, env, tmp_path / "drainer.log")
    try:
        wait_until(ShardLease.objects.held().exists, timeout=30, message="never claimed")
        assert status_json()["outbox.RegionOutbox"]["leased_shards"] == 1
        drainer.popen.kill()
        drainer.popen.wait(10)
    finally:
        drainer.stop()
    wait_until(ShardLease.objects.expired().exists, timeout=10, message="lease never expired")
    region = status_json()["outbox.RegionOutbox"]
    assert (region["expired_shards"], region["leased_shards"]) == (1, 0)
    page = admin_client.get(reverse("admin:outbox_shardlease_changelist") + "?state=expired")
    assert b"expired" in page.content and b">7<" in page.content
    assert not Delivery.objects.exists()  # the receiver never finished
