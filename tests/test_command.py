"""manage.py drain_outboxes: summary, filters, and the exit status of failures."""

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from outbox.models import RegionOutbox
from tests.conftest import committing, server_database_only
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing


def drain(*args):
    out = io.StringIO()
    call_command("drain_outboxes", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_drains_everything_and_prints_a_summary(calls):
    for n in range(4):
        RegionOutboxFactory(shard_identifier=n % 2, object_identifier=n)
    ControlOutboxFactory()
    output = drain()
    assert "shards 3, receiver calls 5, rows retired 5" in output
    assert len(calls.calls) == 5


def test_failure_exits_with_status_3(calls):
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    with pytest.raises(CommandError, match="1 delivery failure") as raised:
        drain()
    assert raised.value.returncode == 3
    assert RegionOutbox.objects.count() == 1


def test_filters_by_table_scope_and_shard(calls):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    ControlOutboxFactory()
    drain("--table", "outbox.ControlOutbox")
    assert [c.get("region_name") for c in calls.calls] == ["us"]
    drain("--scope", "ORGANIZATION", "--shard", "2")
    assert [c["shard_identifier"] for c in calls.calls[1:]] == [2]
    drain("--scope", "USER")
    assert len(calls.calls) == 2


def test_bad_arguments_are_clear_errors():
    with pytest.raises(CommandError, match="Unknown outbox table"):
        drain("--table", "outbox.Nope")
    with pytest.raises(CommandError, match="not an outbox table"):
        drain("--table", "outbox.ShardLease")
    with pytest.raises(CommandError, match="Unknown scope"):
        drain("--scope", "NOPE")
    with pytest.raises(CommandError, match="Unknown database 'nosuch'"):
        drain("--database", "nosuch")


def test_refuses_to_drain_inside_an_open_transaction(calls):
    RegionOutboxFactory(shard_identifier=1)
    with transaction.atomic(), pytest.raises(CommandError, match="inside an open transaction"):
        drain()
    assert calls.calls == [] and RegionOutbox.objects.count() == 1


def test_max_seconds_ends_a_loop(calls, settings):
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    RegionOutboxFactory(shard_identifier=1)
    output = drain("--loop", "--max-seconds", "1", "--progress-every", "0")
    assert "receiver calls 1" in output


@server_database_only
def test_loop_survives_losing_its_database_connection(calls, settings):
    settings.OUTBOX_LEASE_SECONDS = 1.0
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.2
    cut = []

    def cut_own_connection(sender, kwargs):
        # As if the server or a proxy dropped the drainer's connection mid-batch.
        if cut:
            return
        cut.append(True)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            else:
                cursor.execute("SELECT CONNECTION_ID()")
                cursor.execute(f"KILL CONNECTION {cursor.fetchone()[0]}")

    calls.during_call = cut_own_connection
    RegionOutboxFactory(shard_identifier=1, payload={"v": 1})
    drain("--loop", "--max-seconds", "5", "--progress-every", "0")
    assert cut and calls.payloads() == [{"v": 1}]
    assert not RegionOutbox.objects.exists()
