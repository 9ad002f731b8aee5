"""The management commands' flags do what they say: `drain_outboxes --concurrency N`
overrides OUTBOX_CONCURRENCY (1: receivers never run at once, for receivers that are not
thread-safe), and a numeric value out of range or an unknown scope or category is a
CommandError naming the flag and what it takes, before anything is delivered."""

import io
import itertools
import sys

import pytest
from django.core.management import CommandError, call_command

from outbox.models import RegionOutbox
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.test_command import drain
from tests.test_slots import Timeline, write

pytestmark = committing


def delivered_at_once(calls, *args):
    """Drain 12 one-row shards whose receiver sleeps 20 ms; the timeline of the calls."""
    write(12)
    timeline = Timeline(calls, wait=lambda kwargs: 0.02)
    assert "rows retired 12" in drain(*args)
    return timeline


def test_concurrency_1_overrides_the_setting_receivers_never_overlap(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    timeline = delivered_at_once(calls, "--concurrency", "1")
    assert timeline.most_at_once() == 1
    assert {entry[2][0] for entry in timeline.entries} == {"outbox-drain"}  # no slot threads


def test_concurrency_1_holds_in_a_loop_too(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    write(12)
    timeline = Timeline(calls, wait=lambda kwargs: 0.02)
    drain("--loop", "--concurrency", "1", "--max-seconds", "1.5", "--progress-every", "0")
    assert len(timeline.entries) == 12 and timeline.most_at_once() == 1


def test_concurrency_4_overrides_the_setting_receivers_overlap(calls, settings):
    settings.OUTBOX_CONCURRENCY = 1
    timeline = delivered_at_once(calls, "--concurrency", "4")
    assert timeline.most_at_once() >= 2
    assert len({entry[2] for entry in timeline.entries}) >= 2


def test_concurrency_given_to_call_command_as_a_keyword(calls, settings):
    settings.OUTBOX_CONCURRENCY = 4
    write(12)
    timeline = Timeline(calls, wait=lambda kwargs: 0.02)
    call_command("drain_outboxes", concurrency=1, stdout=io.StringIO())
    assert len(timeline.entries) == 12 and timeline.most_at_once() == 1


@server_database_only
def test_concurrency_1_in_a_real_drain_outboxes_process(tmp_path):
    """As an operator runs it: one receiver thread, no two calls at once, although
    OUTBOX_CONCURRENCY is 4."""
    from tests.testapp.models import Delivery
    from tests.workers import Process, worker_env

    write(12)
    env = worker_env(receiver_delay=0.02, OUTBOX_CONCURRENCY=4)
    args = [sys.executable, "-m", "django", "drain_outboxes", "--concurrency", "1"]
    process = Process(args, env, tmp_path / "drain.log")
    try:
        assert process.popen.wait(120) == 0, process.output()
    finally:
        process.stop()
    calls = list(Delivery.objects.order_by("started"))
    assert len(calls) == 12 and not RegionOutbox.objects.exists()
    assert {call.thread for call in calls} == {"outbox-drain"}  # no slot threads
    assert all(later.started >= earlier.ended for earlier, later in itertools.pairwise(calls))


def refused(command, *args):
    with pytest.raises(CommandError) as raised:
        call_command(command, *args, stdout=io.StringIO(), stderr=io.StringIO())
    return str(raised.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--concurrency", "0"], "--concurrency must be a whole number of 1 or more, not 0"),
        (["--concurrency", "-3"], "--concurrency must be a whole number of 1 or more, not -3"),
        (["--max-seconds", "-1"], "--max-seconds must be a number of seconds above 0, not -1"),
        (["--max-seconds", "0"], "--max-seconds must be a number of seconds above 0, not 0"),
        (["--max-seconds", "nan"], "--max-seconds must be a number of seconds above 0, not nan"),
        (["--progress-every", "-5"], "--progress-every must be a number of seconds, 0 or more"),
        (["--progress-every", "inf"], "--progress-every must be a number of seconds, 0 or more"),
        (["--shard", str(2**63)], "--shard must be a whole number from -9223372036854775808"),
    ],
)
def test_drain_refuses_numbers_out_of_range_and_delivers_nothing(calls, args, words):
    RegionOutboxFactory(shard_identifier=1)
    assert words in refused("drain_outboxes", *args)
    assert calls.calls == [] and RegionOutbox.objects.count() == 1


def test_drain_refuses_a_number_out_of_range_given_as_a_keyword():
    with pytest.raises(CommandError, match="--max-seconds must be a number of seconds"):
        call_command("drain_outboxes", max_seconds=-1, stdout=io.StringIO())


def test_an_unknown_scope_lists_the_valid_ones():
    for name in ("NOPE", "7"):
        message = refused("drain_outboxes", "--scope", name)
        assert f"Unknown scope {name!r}" in message
        assert "ORGANIZATION (0), USER (1)" in message


def test_prune_inbox_refuses_a_slice_of_no_rows():
    message = refused("outbox_prune_inbox", "--slice-rows", "0")
    assert "--slice-rows must be a whole number of 1 or more, not 0" in message


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--id", "0"], "--id must be a whole number from 1 to"),
        (["--shard", str(-(2**63) - 1)], "--shard must be a whole number from"),
    ],
)
def test_dead_letters_refuse_numbers_out_of_range(args, words):
    assert words in refused("outbox_dead_letters", "list", *args)


def test_an_unknown_category_lists_the_valid_ones():
    for name in ("NOPE", "9"):
        message = refused("outbox_dead_letters", "list", "--category", name)
        assert f"Unknown category {name!r}" in message
        assert "ORGANIZATION_UPDATE (1), AUDIT_EVENT (2), USER_UPDATE (3), LEDGER_ENTRY (4)" in (
            message
        )
