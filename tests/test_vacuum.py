"""Vacuum health (`outbox.health.vacuum`): on PostgreSQL, the oldest transaction holding back
vacuum and the dead tuples of the outbox tables and the lease table, in `outbox_status`,
its thresholds and the health checks; elsewhere "not available", never an error."""

import io
import json
import os
import re
import time
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, models
from django.test.utils import isolate_apps

from outbox.exceptions import InvalidThreshold
from outbox.health import Thresholds, check, problems, statuses
from outbox.health.vacuum import read
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.workers import wait_until

pytestmark = committing

postgres_only = pytest.mark.skipif(
    settings.TEST_DB != "postgres", reason="vacuum figures exist on PostgreSQL only"
)
HOLDER = "outbox-test-xmin-holder"


def status(*args):
    """`outbox_status --json`'s entries by table, and its text output."""
    out, text = io.StringIO(), io.StringIO()
    call_command("outbox_status", "--json", *args, stdout=out)
    call_command("outbox_status", *args, stdout=text)
    return {table["table"]: table for table in json.loads(out.getvalue())}, text.getvalue()


def oldest_xmin():
    return status()[0]["outbox.RegionOutbox"]["vacuum"]["oldest_xmin"]


@contextmanager
def open_transaction():
    """A second session holding a REPEATABLE READ transaction with an xid and a
    snapshot, idle in transaction, as a forgotten report or a debugging session does."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SET application_name = '{HOLDER}'")
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT txid_current(), pg_backend_pid()")
            yield cursor.fetchone()[1]
            cursor.execute("ROLLBACK")
    finally:
        other.close()


@postgres_only
def test_an_open_transaction_is_named_its_age_grows_and_it_passes_max_xmin_age():
    with open_transaction() as holder_pid:
        RegionOutboxFactory(shard_identifier=1)  # a write after it: its xid age grows
        first = oldest_xmin()
        assert (first["kind"], first["pid"], first["application"]) == (
            "session",
            holder_pid,
            HOLDER,
        )
        assert first["state"] == "idle in transaction" and first["xid_age"] >= 1
        time.sleep(1.0)
        later = oldest_xmin()
        assert later["age_seconds"] >= first["age_seconds"] + 0.9
        for option in ("--max-xmin-age", "--max-xmin-xids"):
            with pytest.raises(CommandError) as passed:
                status(option, "0")
            assert passed.value.returncode == 6
            assert "default: the oldest transaction holding back vacuum is over 0" in str(
                passed.value
            )
            assert f"session pid {holder_pid}" in str(passed.value) and HOLDER in str(passed.value)
        _, text = status("--max-xmin-age", "3600", "--max-xmin-xids", "1000000")
        assert f"oldest transaction holding back vacuum: session pid {holder_pid}" in text
        found = check(thresholds=Thresholds(max_xmin_age_seconds=0))
        assert any("holding back vacuum" in problem for problem in found), found
        health_check_fails("max_xmin_age_seconds", "holding back vacuum")
    after = oldest_xmin()
    assert after is None or after["pid"] != holder_pid


@postgres_only
def test_a_role_that_is_not_a_superuser_reads_it_without_the_other_sessions_age():
    """pg_stat_activity shows another role's session's pid, role, application and
    xmin, but not its state nor when its transaction began."""
    suffix = re.sub(r"\W", "_", os.environ.get("OUTBOX_TEST_DB_SUFFIX", ""))  # a bare name
    role = f"outbox_reader{suffix}".lower()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP ROLE IF EXISTS {role}")
        cursor.execute(f"CREATE ROLE {role} NOLOGIN")
        try:
            with open_transaction() as holder_pid:
                cursor.execute(f"SET ROLE {role}")
                try:
                    reading = read("default", [RegionOutbox])
                finally:
                    cursor.execute("RESET ROLE")
        finally:
            cursor.execute(f"DROP ROLE {role}")
    holder = reading["oldest_xmin"]
    assert (holder["pid"], holder["application"]) == (holder_pid, HOLDER)
    assert holder["role"] == connection.settings_dict["USER"]
    assert holder["xid_age"] >= 1 and (holder["age_seconds"], holder["state"]) == (None, None)
    assert reading["tables"]["outbox.RegionOutbox"]["table"] == "outbox_regionoutbox"
    assert reading["tables"]["outbox.ShardLease"]["live_tuples"] is not None
    # Its age in seconds unknown, only the limit in transaction ids can judge it.
    [table] = statuses(models=[RegionOutbox], vacuum=False)
    table["vacuum"] = {
        "table": reading["tables"]["outbox.RegionOutbox"],
        "lease_table": reading["tables"]["outbox.ShardLease"],
        "oldest_xmin": holder,
    }
    [found] = problems([table], Thresholds(max_xmin_age_seconds=0, max_xmin_xids=0))
    assert "is over 0 xids: session pid" in found and "state hidden" in found


@pytest.fixture
def autovacuum_off():
    """No autovacuum on the outbox table while a test counts its dead tuples."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE outbox_regionoutbox SET (autovacuum_enabled = off)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE outbox_regionoutbox RESET (autovacuum_enabled)")


def dead_tuples():
    return status()[0]["outbox.RegionOutbox"]["vacuum"]["table"]["dead_tuples"]


@postgres_only
def test_deleted_rows_show_as_dead_tuples_and_pass_max_dead_tuples(autovacuum_off):
    RegionOutboxFactory.create_batch(30, shard_identifier=2)
    RegionOutbox.objects.all().delete()
    with connection.cursor() as cursor:
        # Statistics reach the server when a session goes idle, at most once a second.
        cursor.execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: dead_tuples() >= 30, timeout=10, message="no dead tuples counted")
    tables, text = status("--max-dead-tuples", "1000000")
    figures = tables["outbox.RegionOutbox"]["vacuum"]["table"]
    assert figures["options"] == ["autovacuum_enabled=off"] and figures["live_tuples"] == 0
    assert tables["outbox.RegionOutbox"]["vacuum"]["lease_table"]["table"] == "outbox_shardlease"
    assert f"vacuum: outbox_regionoutbox: {figures['dead_tuples']} dead / 0 live tuples" in text
    assert "lease table outbox_shardlease: " in text
    assert ", options autovacuum_enabled=off\n" in text
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        server = cursor.fetchone()[0] == "on"
    assert tables["outbox.RegionOutbox"]["vacuum"]["autovacuum"] is server
    assert f"default: autovacuum {'on' if server else 'OFF'}, oldest transaction" in text
    with pytest.raises(CommandError) as passed:
        status("--max-dead-tuples", "29")
    assert passed.value.returncode == 6
    assert f"{figures['dead_tuples']} dead tuples in outbox_regionoutbox, over 29" in str(
        passed.value
    )
    health_check_fails("max_dead_tuples", "dead tuples in outbox_regionoutbox")


@postgres_only
@isolate_apps("tests.testapp")
def test_a_table_in_another_schema_is_found_by_its_real_name():
    class Elsewhere(models.Model):  # noqa: DJ008
        class Meta:
            app_label = "testapp"
            managed = False
            db_table = 'outbox_elsewhere"."queue'  # Django's way to name a schema

    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA outbox_elsewhere")
        try:
            cursor.execute("CREATE TABLE outbox_elsewhere.queue (id int)")
            cursor.execute("INSERT INTO outbox_elsewhere.queue SELECT generate_series(1, 5)")
            cursor.execute("SELECT pg_stat_force_next_flush()")
            wait_until(
                lambda: read("default", [Elsewhere])["tables"]["testapp.Elsewhere"]["live_tuples"],
                timeout=10,
                message="no statistics for outbox_elsewhere.queue",
            )
        finally:
            cursor.execute("DROP SCHEMA outbox_elsewhere CASCADE")
    figures = read("default", [Elsewhere])["tables"]["testapp.Elsewhere"]
    assert figures["live_tuples"] is None  # dropped: no statistics, no error
    assert figures["table"] == 'outbox_elsewhere"."queue'


def health_check_fails(option, words):
    pytest.importorskip("health_check")
    from health_check.exceptions import ServiceUnavailable

    from outbox.integrations.health_check import OutboxHealthCheck

    with pytest.raises(ServiceUnavailable, match=words):
        OutboxHealthCheck(**{option: 0}).run()


@pytest.mark.skipif(settings.TEST_DB == "postgres", reason="PostgreSQL has vacuum figures")
def test_other_databases_say_not_available_and_pass_the_vacuum_thresholds():
    RegionOutboxFactory(shard_identifier=3)
    tables, text = status("--max-xmin-age", "0", "--max-xmin-xids", "0", "--max-dead-tuples", "0")
    assert all(table["vacuum"] is None for table in tables.values())
    name = connection.display_name
    assert "outbox.RegionOutbox (default): 1 rows" in text
    assert f"    vacuum: not available on {name} (PostgreSQL only)" in text
    assert read("default", [RegionOutbox]) is None
    limits = Thresholds(max_xmin_age_seconds=0, max_xmin_xids=0, max_dead_tuples=0)
    assert check(thresholds=limits) == []


@pytest.mark.parametrize(
    ("limit", "value"),
    [
        ("max_xmin_age_seconds", -1),
        ("max_xmin_age_seconds", float("nan")),
        ("max_dead_tuples", 1.5),
        ("max_dead_tuples", True),
        ("max_xmin_xids", 2.0),
    ],
)
def test_vacuum_thresholds_are_validated_like_the_others(limit, value):
    with pytest.raises(InvalidThreshold, match=f"Thresholds.{limit} must be"):
        Thresholds(**{limit: value})


def test_negative_vacuum_options_are_command_errors():
    for option in ("--max-xmin-age", "--max-xmin-xids", "--max-dead-tuples"):
        with pytest.raises(CommandError, match=f"{option} must not be negative"):
            call_command("outbox_status", option, "-1", stdout=io.StringIO())
