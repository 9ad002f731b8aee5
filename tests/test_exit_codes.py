"""Exit statuses a supervisor can trust (`outbox.management.exit_codes`): a stop asked
for and the end of a loop are 0 whatever failed meanwhile, a receiver that asked to be
retried later is no failure, a passed threshold has a status of its own, and a task's
result counts what it dead-lettered."""

import io
import os
import signal
import threading
import time

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from outbox import RetryLater
from outbox.engine import drain_outboxes
from outbox.integrations.dispatch import stats_summary
from outbox.models import RegionOutbox
from outbox.signals import delivery_failed, process_region_outbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.test_command import drain
from tests.testapp.categories import Category

pytestmark = committing


def test_a_receiver_asking_to_retry_later_is_no_failure_of_the_run(calls):
    def later(sender, **kwargs):
        raise RetryLater(600, "rate limited")

    process_region_outbox.connect(later, sender=Category.AUDIT_EVENT, weak=False)
    try:
        RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT)
        output = drain()  # no CommandError: status 0
    finally:
        process_region_outbox.disconnect(later, sender=Category.AUDIT_EVENT)
    assert "failures 1 (1 asked to retry later)" in output
    assert RegionOutbox.objects.count() == 1  # kept, rescheduled


def test_a_real_failure_still_fails_a_one_shot_drain(calls):
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    with pytest.raises(CommandError) as raised:
        drain()
    assert raised.value.returncode == 3


def test_a_loop_stopped_by_sigterm_after_a_failure_exits_0(calls, settings):
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    sent = []  # time.monotonic() when the SIGTERM was sent
    stray = []  # signals that reached this test's own handler instead of the command's

    def sigterm():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    # A real SIGTERM to this process a while after the failure, the loop idle by then and
    # meant to go on for its whole --max-seconds; the command's handler (main thread)
    # should take it.
    stopper = threading.Timer(0.5, sigterm)

    def failed(sender, **kwargs):
        if not stopper.is_alive() and not sent:  # at the first failure only
            stopper.start()

    delivery_failed.connect(failed, sender=RegionOutbox, weak=False)
    # Outside the command's handler a SIGTERM would end the test run: it lands here.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stray.append(signum))
    out, err = io.StringIO(), io.StringIO()
    try:
        # No CommandError: status 0.
        call_command(
            "drain_outboxes",
            *("--loop", "--max-seconds", "30", "--progress-every", "0"),
            stdout=out,
            stderr=err,
        )
        returned = time.monotonic()
    finally:
        stopper.cancel()
        delivery_failed.disconnect(failed, sender=RegionOutbox)
        signal.signal(signal.SIGTERM, previous)
    # The loop ran until the signal, heard it, said so and stopped on it: not before (by
    # itself), nor at the end of its --max-seconds.
    assert len(sent) == 1 and stray == [], err.getvalue()
    assert err.getvalue().count("signal 15, stopping after the current receiver") == 1
    assert returned - sent[0] < 10, err.getvalue()
    assert "failures 1" in out.getvalue()  # it failed, was told to stop, and says so


def test_a_loop_that_ran_its_time_after_a_failure_exits_0(calls, settings):
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    assert "failures 1" in drain("--loop", "--max-seconds", "0.5", "--progress-every", "0")


def test_a_passed_threshold_has_a_status_of_its_own(calls):
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    RegionOutbox.objects.update(dead_at=Now())
    with pytest.raises(CommandError, match="dead") as raised:
        call_command("outbox_status", "--max-dead", "0", stdout=io.StringIO())
    assert raised.value.returncode == 6  # not 1 (command error) nor 2 (usage)


def test_a_task_result_counts_dead_letters(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    result = stats_summary(drain_outboxes())
    assert (result["failures"], result["dead_lettered"], result["retried_later"]) == (0, 1, 0)


def test_a_one_shot_drain_during_a_back_off_says_what_waits(calls):
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    with pytest.raises(CommandError):
        drain()  # the failure: the shard backs off
    calls.failing = set()
    output = drain()  # nothing is due: status 0, and it says why rows remain
    assert "receiver calls 0" in output
    assert "1 shard(s) back off after a failure, their rows kept; the first retry" in output
