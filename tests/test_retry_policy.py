"""Issue #34 (item 3): the retry policy is one replaceable object.

The stock `RetryPolicy` keeps today's behaviour (pinned here against the back-off
settings, and by the existing failure tests unchanged); a subclass named in
`OUTBOX_RETRY_POLICY` is what real drains apply (the rows' `scheduled_for`, the shard's
back-off, dead-lettering), and a category's own policy applies to that category only.
"""

import random

import pytest
from django.db.models.functions import Now

from outbox import OutboxCategory, OutboxScope, RetryLater, RetryPolicy
from outbox.checks.declarations import check_category_policies
from outbox.checks.settings import check_settings
from outbox.engine import drain_outboxes
from outbox.exceptions import NoReceiver, PermanentFailure
from outbox.models import RegionOutbox, ShardLease
from outbox.retry import Failure
from outbox.signals import process_region_outbox
from outbox.testing import deliver_pending
from outbox.writes.context import outbox_context
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

TOLERANCE = 1.0  # seconds between two reads of one database clock in one settle


class FixedPolicy(RetryPolicy):
    """Every retry five seconds after its failure; a dead letter at the second failure."""

    def delay(self, attempt):
        return 5.0

    def max_attempts(self, category):
        return 2


class RejectsValueErrors(RetryPolicy):
    """The docs' example: a ValueError is final, whatever the attempt limit."""

    def is_final(self, failure):
        return any(isinstance(e, ValueError) for e in failure.errors) or super().is_final(failure)


class NotAPolicy:
    pass


def make_due():
    """Skip the back-off: every shard and row due now (database clock)."""
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.pending().update(scheduled_for=Now())


def waited(row):
    """Seconds a failed row was rescheduled for, measured on the database clock."""
    return (row.scheduled_for - row.scheduled_from).total_seconds()


def lease_wait(row):
    """Seconds the row's shard backs off, from the row's rescheduling."""
    lease = ShardLease.objects.get(shard_identifier=row.shard_identifier)
    return (lease.expires_at - row.scheduled_from).total_seconds()


def ceiling(settings, attempt):
    return min(
        settings.OUTBOX_BACKOFF_MAX_SECONDS,
        settings.OUTBOX_BACKOFF_BASE_SECONDS * 2 ** (attempt - 1),
    )


@pytest.mark.parametrize("base, cap", [(30.0, 900.0), (1.0, 10.0), (0.5, 0.5)])
def test_the_default_delays_follow_the_backoff_settings(settings, base, cap):
    settings.OUTBOX_BACKOFF_BASE_SECONDS = base
    settings.OUTBOX_BACKOFF_MAX_SECONDS = cap
    policy = RetryPolicy()
    random.seed(34)
    for attempt in range(1, 16):
        top = min(cap, base * 2 ** (attempt - 1))
        assert policy.ceiling(attempt) == top
        draws = [policy.delay(attempt) for _ in range(200)]
        assert all(top / 2 <= draw <= top for draw in draws)
        # Jittered over the whole half: shards that failed together spread out.
        assert min(draws) < top * 0.6 and max(draws) > top * 0.9


def test_the_default_decisions(settings):
    settings.OUTBOX_MAX_ATTEMPTS = 3
    policy = RetryPolicy()
    down = RuntimeError("down")
    assert not policy.is_final(Failure(2, [1], [down]))
    assert policy.is_final(Failure(2, [2], [down]))  # the third failed attempt
    assert not policy.is_final(Failure(2, [9], [NoReceiver("none")]))
    assert policy.is_final(Failure(2, [0], [PermanentFailure("never")]))
    # Every receiver asked for later: the longest asked delay, for every row, at least 1s.
    assert policy.row_delays(Failure(2, [0, 5], [RetryLater(0), RetryLater(7)])) == [7.0, 7.0]
    assert policy.row_delays(Failure(2, [0], [RetryLater(0)])) == [1.0]
    # Mixed: the head waits the longer of its back-off and the asked delay; later rows
    # their own back-off, capped at the head's.
    head, later = policy.row_delays(Failure(2, [0, 0], [RetryLater(100), down]))
    assert head == 100.0 and 15 <= later <= 30
    head, later = policy.row_delays(Failure(2, [0, 5], [down]))
    assert 15 <= head <= 30 and later == head


@committing
def test_the_default_delays_in_real_drains(calls, settings):
    """Attempts 1..6 of one failing shard: each reschedules the row, and backs its shard
    off, within the jitter of the attempt's ceiling (10, 20, 40, then the 80s cap)."""
    settings.OUTBOX_BACKOFF_BASE_SECONDS = 10.0
    settings.OUTBOX_BACKOFF_MAX_SECONDS = 80.0
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1)
    for attempt in range(1, 7):
        assert drain_outboxes().failures == 1
        row = RegionOutbox.objects.get()
        top = ceiling(settings, attempt)
        assert row.attempts == attempt and row.dead_at is None
        assert top / 2 - TOLERANCE <= waited(row) <= top + TOLERANCE
        assert abs(lease_wait(row) - waited(row)) <= TOLERANCE
        make_due()


@committing
def test_a_policy_named_in_the_setting_is_what_drains_apply(calls, settings):
    settings.OUTBOX_RETRY_POLICY = "tests.test_retry_policy.FixedPolicy"
    settings.OUTBOX_MAX_ATTEMPTS = 0  # the stock policy would never give up
    calls.failing = {1}
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    RegionOutboxFactory(shard_identifier=2, object_identifier=2)
    stats = drain_outboxes()
    assert (stats.failures, stats.dead_lettered, len(calls.calls)) == (1, 0, 1)
    row = RegionOutbox.objects.get()
    # The stock back-off would be 15 to 30 seconds (OUTBOX_BACKOFF_BASE_SECONDS=30).
    assert abs(waited(row) - 5.0) <= TOLERANCE
    assert abs(lease_wait(row) - 5.0) <= TOLERANCE
    make_due()
    stats = drain_outboxes()
    assert (stats.failures, stats.dead_lettered) == (0, 1)
    dead = RegionOutbox.objects.dead().get()
    assert dead.id == row.id and dead.attempts == 2
    assert not ShardLease.objects.exists()  # the shard goes on


@committing
def test_a_policy_decides_which_failures_are_final(calls, settings):
    settings.OUTBOX_RETRY_POLICY = "tests.test_retry_policy.RejectsValueErrors"

    def rejects(sender, kwargs):
        if kwargs["shard_identifier"] == 1:
            raise ValueError("malformed")

    calls.during_call = rejects
    calls.failing = {2}
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    RegionOutboxFactory(shard_identifier=2, object_identifier=2)
    stats = drain_outboxes()
    assert (stats.failures, stats.dead_lettered) == (1, 1)
    assert RegionOutbox.objects.dead().get().shard_identifier == 1
    assert RegionOutbox.objects.pending().get().shard_identifier == 2  # RuntimeError: retried


@pytest.mark.django_db(databases=["default", "control"])
def test_the_test_mode_delivery_applies_the_policy(calls, settings):
    settings.OUTBOX_RETRY_POLICY = "tests.test_retry_policy.FixedPolicy"
    calls.failing = {1}
    with outbox_context(flush=False):
        RegionOutboxFactory(shard_identifier=1)
    deliver_pending()
    row = RegionOutbox.objects.get()
    assert row.attempts == 1 and row.dead_at is None
    assert abs(waited(row) - 5.0) <= TOLERANCE
    RegionOutbox.objects.update(scheduled_for=Now())
    deliver_pending()
    assert RegionOutbox.objects.dead().get().attempts == 2


@pytest.fixture
def own_policy_categories(scratch_registry):
    """Two categories failing in real drains: FRAGILE declares a FixedPolicy instance,
    PATIENT follows the setting."""

    class Mixed(OutboxCategory):
        FRAGILE = 911
        PATIENT = 912

        def retry_policy(self):
            return FixedPolicy() if self is Mixed.FRAGILE else None

    class MixedScope(OutboxScope):
        MIXED = 910, {Mixed.FRAGILE, Mixed.PATIENT}

    def always_fails(sender, **kwargs):
        raise RuntimeError("down")

    for category in Mixed:
        process_region_outbox.connect(always_fails, sender=category, weak=False)
    yield Mixed, MixedScope
    for category in Mixed:
        process_region_outbox.disconnect(always_fails, sender=category)


@committing
def test_a_category_policy_applies_to_that_category_only(settings, own_policy_categories):
    Mixed, MixedScope = own_policy_categories
    settings.OUTBOX_MAX_ATTEMPTS = 0
    for identifier, category in [(1, Mixed.FRAGILE), (2, Mixed.PATIENT)]:
        RegionOutboxFactory(
            shard_scope=MixedScope.MIXED, shard_identifier=identifier, category=category
        )
    assert drain_outboxes().failures == 2
    fragile = RegionOutbox.objects.get(category=Mixed.FRAGILE)
    patient = RegionOutbox.objects.get(category=Mixed.PATIENT)
    assert abs(waited(fragile) - 5.0) <= TOLERANCE
    assert 15 - TOLERANCE <= waited(patient) <= 30 + TOLERANCE  # the stock back-off
    make_due()
    stats = drain_outboxes()
    assert (stats.failures, stats.dead_lettered) == (1, 1)
    assert RegionOutbox.objects.dead().get().category == Mixed.FRAGILE
    assert RegionOutbox.objects.pending().get().attempts == 2


@pytest.mark.parametrize(
    "path, problem",
    [
        ("tests.no_such_module.Policy", "cannot be imported"),
        ("tests.test_retry_policy.NotAPolicy", "is not a subclass of outbox.retry.RetryPolicy"),
        ("outbox.RetryLater", "is not a subclass of outbox.retry.RetryPolicy"),
    ],
)
def test_a_setting_that_names_no_policy_fails_the_check(settings, path, problem):
    settings.OUTBOX_RETRY_POLICY = path
    [error] = [message for message in check_settings() if message.id == "outbox.E020"]
    assert path in error.msg and problem in error.msg
    assert "RetryPolicy" in error.hint


def test_a_setting_that_names_a_policy_passes_the_check(settings):
    settings.OUTBOX_RETRY_POLICY = "tests.test_retry_policy.FixedPolicy"
    assert not [message for message in check_settings() if message.id == "outbox.E020"]


def test_a_category_that_returns_no_policy_fails_the_check(scratch_registry):
    assert check_category_policies() == []

    class Wrong(OutboxCategory):
        ODD = 921

        def retry_policy(self):
            return "tests.test_retry_policy.FixedPolicy"

    class WrongScope(OutboxScope):
        WRONG = 920, {Wrong.ODD}

    [error] = check_category_policies()
    assert error.id == "outbox.E021"
    assert "Wrong.ODD.retry_policy()" in error.msg and "not a RetryPolicy" in error.msg
