"""`drain_outboxes --loop`'s heartbeat says what happened since the last one (rows
retired in its interval and their rate) beside the totals since the start: a stall reads
as 0 rows/s, not as the average since the start ("534 rows retired in 45s (12 rows/s)"
during a total stall). Its numbers are fields of the log record too."""

import io
import logging

import pytest
from django.core.management import call_command
from django.db import OperationalError

import outbox.management.commands.drain_outboxes as drain_command
from outbox.engine import DrainStats
from outbox.management.commands.drain_outboxes import Command as DrainCommand
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing


def heartbeats(caplog):
    return [r for r in caplog.records if getattr(r, "event", "") == "outbox.heartbeat"]


@pytest.fixture
def command():
    command = DrainCommand(stdout=io.StringIO())
    command.verbosity, command.using = 2, "default"
    return command


def test_a_stall_reads_as_0_rows_per_second_beside_the_totals(command, caplog):
    RegionOutboxFactory.create_batch(3, shard_identifier=1)  # a backlog that waits
    with caplog.at_level(logging.INFO, logger="outbox.engine"):
        command._heartbeat(DrainStats(rows_retired=534, failures=2), 45.0)
        command._heartbeat(DrainStats(rows_retired=534, failures=2), 105.0)  # stalled
    first, stalled = command.stdout.getvalue().splitlines()
    assert first.startswith(
        "outbox drain alive: 534 rows retired in the last 45s (12 rows/s), 2 failures; "
        "since start 534 rows retired in 45s (12 rows/s), 2 failures; backlog 3 rows"
    ), first
    assert stalled.startswith(
        "outbox drain alive: 0 rows retired in the last 60s (0 rows/s), 0 failures; "
        "since start 534 rows retired in 105s (5.1 rows/s), 2 failures; "
        "backlog 3 rows (3 due) in 1 shards"
    ), stalled
    record = heartbeats(caplog)[-1]
    assert record.getMessage() == stalled
    fields = {name: getattr(record, name) for name in FIELDS}
    assert fields == {
        "interval_seconds": 60.0,
        "rows_retired": 0,
        "rows_per_second": 0.0,
        "failures": 0,
        "total_seconds": 105.0,
        "total_rows_retired": 534,
        "total_rows_per_second": 5.086,
        "total_failures": 2,
        "backlog_rows": 3,
        "backlog_due_rows": 3,
        "backlog_shards": 1,
        "backlog_dead_letters": 0,
        "stuck_receivers": 0,
    }
    assert 0 <= record.backlog_lag_seconds < 60
    assert heartbeats(caplog)[0].rows_per_second == 11.867


FIELDS = (
    "interval_seconds",
    "rows_retired",
    "rows_per_second",
    "failures",
    "total_seconds",
    "total_rows_retired",
    "total_rows_per_second",
    "total_failures",
    "backlog_rows",
    "backlog_due_rows",
    "backlog_shards",
    "backlog_dead_letters",
    "stuck_receivers",
)


def test_an_unread_backlog_leaves_its_fields_empty_and_the_rates_stand(
    command, caplog, monkeypatch
):
    def unreachable(using):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(drain_command, "backlog_figures", unreachable)
    with caplog.at_level(logging.INFO, logger="outbox.engine"):
        command._heartbeat(DrainStats(rows_retired=10), 2.0)
    [record] = heartbeats(caplog)
    assert "backlog unknown (database unreachable)" in record.getMessage()
    assert "10 rows retired in the last 2.0s (5.0 rows/s)" in record.getMessage()
    assert (record.rows_retired, record.rows_per_second) == (10, 5.0)
    assert record.backlog_rows is None and record.backlog_lag_seconds is None


def test_the_loops_heartbeats_add_up_to_its_totals(settings, caplog):
    settings.OUTBOX_HEARTBEAT_SECONDS = 0.25
    RegionOutboxFactory.create_batch(2, shard_identifier=9)
    with caplog.at_level(logging.INFO, logger="outbox.engine"):
        call_command(
            "drain_outboxes", "--loop", "--max-seconds", "1.2", "-v", "2", stdout=io.StringIO()
        )
    beats = heartbeats(caplog)
    assert len(beats) >= 3, [beat.getMessage() for beat in beats]
    assert sum(beat.rows_retired for beat in beats) == beats[-1].total_rows_retired == 2
    # Delivered at once: the later intervals retired nothing, and say so.
    last = beats[-1]
    assert (last.rows_retired, last.rows_per_second) == (0, 0.0)
    assert "0 rows retired in the last" in last.getMessage() and "(0 rows/s)" in last.getMessage()
    assert "since start 2 rows retired in" in last.getMessage()
    assert 0.1 <= last.interval_seconds <= 1.0
    assert last.total_seconds >= sum(beat.interval_seconds for beat in beats) - 0.01
