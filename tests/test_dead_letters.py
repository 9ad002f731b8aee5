"""Dead letters: exhausted or permanently failed messages are kept aside, their shard
goes on, and an operator lists, retries or discards them."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now
from django.dispatch import receiver
from django.utils import timezone

from outbox import OutboxCategory, OutboxScope
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox, ShardLease
from outbox.signals import process_region_outbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category

pytestmark = committing


def make_due():
    """Skip the back-off: every shard and row due now (database clock)."""
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.pending().update(scheduled_for=Now())


def poison_and_followers(calls):
    calls.during_call = poison_fails
    poison = RegionOutboxFactory(shard_identifier=1, object_identifier=1, payload={"v": "poison"})
    for n in (2, 3):
        RegionOutboxFactory(shard_identifier=1, object_identifier=n, payload={"v": n})
    return poison


def poison_fails(sender, kwargs):
    if kwargs["payload"] == {"v": "poison"}:
        raise RuntimeError("poisoned")


def test_poison_message_is_dead_after_max_attempts_and_the_shard_goes_on(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 3
    poison = poison_and_followers(calls)
    for attempt in (1, 2):
        stats = drain_outboxes()
        assert (stats.failures, stats.dead_lettered, calls.payloads()) == (1, 0, [])
        assert RegionOutbox.objects.get(id=poison.id).attempts == attempt
        make_due()
    stats = drain_outboxes()
    assert (stats.failures, stats.dead_lettered) == (0, 1)
    assert calls.payloads() == [{"v": 2}, {"v": 3}]  # the rest of the shard, in order
    dead = RegionOutbox.objects.get()
    assert dead.id == poison.id and dead.dead_at is not None and dead.attempts == 3
    assert dead.first_attempt_at <= dead.last_attempt_at
    assert "poisoned" in dead.last_error and "RuntimeError" in dead.last_traceback
    assert not ShardLease.objects.exists()
    # A dead letter never blocks its shard again, nor is it delivered.
    RegionOutboxFactory(shard_identifier=1, object_identifier=4, payload={"v": 4})
    assert drain_outboxes().receiver_calls == 1
    assert calls.payloads()[-1] == {"v": 4}
    assert list(RegionOutbox.objects.values_list("id", flat=True)) == [poison.id]


def test_off_by_default_the_shard_stays_blocked(calls):
    poison_and_followers(calls)
    for _ in range(5):
        drain_outboxes()
        make_due()
    assert calls.payloads() == [] and not RegionOutbox.objects.dead().exists()
    assert RegionOutbox.objects.order_by("id").first().attempts == 5


def test_a_category_sets_its_own_max_attempts(calls, settings, scratch_registry):
    class Limited(OutboxCategory):
        FRAGILE = 901
        PATIENT = 902

        def max_attempts(self):
            return 1 if self is Limited.FRAGILE else None

    class LimitedScope(OutboxScope):
        LIMITED = 900, {Limited.FRAGILE, Limited.PATIENT}

    @receiver(process_region_outbox, sender=Limited.FRAGILE, weak=False)
    @receiver(process_region_outbox, sender=Limited.PATIENT, weak=False)
    def always_fails(sender, **kwargs):
        raise RuntimeError("down")

    settings.OUTBOX_MAX_ATTEMPTS = 0
    try:
        for identifier, category in [(1, Limited.FRAGILE), (2, Limited.PATIENT)]:
            RegionOutboxFactory(
                shard_scope=LimitedScope.LIMITED, shard_identifier=identifier, category=category
            )
        stats = drain_outboxes()
    finally:
        for category in Limited:
            process_region_outbox.disconnect(always_fails, sender=category)
    assert (stats.dead_lettered, stats.failures) == (1, 1)
    assert RegionOutbox.objects.dead().get().category == Limited.FRAGILE
    assert RegionOutbox.objects.pending().get().category == Limited.PATIENT


def test_retry_dead_puts_rows_back_in_their_shard_due_now(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    poison = poison_and_followers(calls)
    drain_outboxes()
    assert RegionOutbox.objects.dead().count() == 1
    calls.during_call = None
    assert RegionOutbox.objects.retry_dead() == 1
    revived = RegionOutbox.objects.get(id=poison.id)
    assert (revived.dead_at, revived.attempts) == (None, 0)
    drain_outboxes()
    assert calls.payloads()[-1] == {"v": "poison"}
    assert not RegionOutbox.objects.exists()


def test_discard_and_the_model_operations(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1, 2}
    first = RegionOutboxFactory(shard_identifier=1)
    second = RegionOutboxFactory(shard_identifier=2)
    drain_outboxes()
    assert RegionOutbox.objects.dead().count() == 2
    assert RegionOutbox.objects.filter(id=first.id).discard() == 1
    row = RegionOutbox.objects.get(id=second.id)
    assert row.retry_dead() and row.dead_at is None
    row.discard()
    assert not RegionOutbox.objects.exists()


def run(*args):
    out = StringIO()
    call_command("outbox_dead_letters", *args, stdout=out)
    return out.getvalue()


def test_the_command_lists_retries_and_discards(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1, 2}
    first = RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT)
    second = RegionOutboxFactory(shard_identifier=2, category=Category.ORGANIZATION_UPDATE)
    RegionOutboxFactory(shard_identifier=3)  # delivered
    drain_outboxes()
    listed = json.loads(run("list", "--json"))
    assert [(r["id"], r["category"]) for r in listed] == [
        (first.id, "AUDIT_EVENT"),
        (second.id, "ORGANIZATION_UPDATE"),
    ]
    assert listed[0]["attempts"] == 1 and "receiver failed" in listed[0]["last_error"]
    assert "2 dead letter(s)" in run("list", "--table", "outbox.RegionOutbox")
    assert json.loads(run("list", "--json", "--category", "audit_event"))[0]["id"] == first.id
    calls.failing = set()
    assert "Retried 1" in run("retry", "--shard", "1")
    drain_outboxes()
    assert "Discarded 1" in run("discard", "--id", str(second.id))
    assert not RegionOutbox.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry"], "Say which dead letters"),
        (["discard", "--category", "NOPE"], "Unknown category"),
        (["list", "--table", "outbox.Nope"], "Unknown outbox table"),
        (["list", "--table", "outbox.ShardLease"], "not an outbox table"),
        (["list", "--database", "nope"], "Unknown database"),
        (["retry", "--all", "--json"], "--json goes with list"),
    ],
)
def test_the_command_refuses_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def dead_letter(error, shard_identifier, category=Category.AUDIT_EVENT):
    return RegionOutboxFactory(
        shard_identifier=shard_identifier,
        category=category,
        attempts=3,
        dead_at=timezone.now(),
        last_error=error,
    )


RECORD = "tests.testapp.receivers.record"


def test_list_group_shows_each_cause_with_its_key(calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1, 2}
    RegionOutboxFactory(shard_identifier=1, category=Category.AUDIT_EVENT)
    RegionOutboxFactory(shard_identifier=2, category=Category.ORGANIZATION_UPDATE)
    drain_outboxes()
    dead_letter("ValueError: bad payload 'x'", 3)
    listed = json.loads(run("list", "--group", "--json"))
    assert [(group["count"], group["failures"]) for group in listed] == [
        (2, [{"receiver": RECORD, "exception": "RuntimeError",
              "message": "receiver failed for shard <n>"}]),
        (1, [{"receiver": "", "exception": "ValueError", "message": "bad payload <str>"}]),
    ]  # fmt: skip
    down = listed[0]
    assert down["table"] == "outbox.RegionOutbox"
    assert down["categories"] == ["AUDIT_EVENT", "ORGANIZATION_UPDATE"]
    assert down["sample_error"] == f"{RECORD}: RuntimeError: receiver failed for shard 1"
    assert down["first_dead_at"] <= down["last_dead_at"] and len(down["sample_ids"]) == 2
    text = run("list", "--group")
    assert "outbox.RegionOutbox: 3 dead letter(s), 2 cause(s)" in text
    assert (
        f"  {down['cause']}  2 dead letter(s): {RECORD}: RuntimeError: receiver failed for "
        "shard <n>\n" in text
    )
    assert "unknown receiver: ValueError: bad payload <str>" in text
    assert text.endswith("2 cause(s).\n")
    only = json.loads(run("list", "--group", "--json", "--cause", down["cause"]))
    assert [group["cause"] for group in only] == [down["cause"]]


def test_retry_and_discard_select_dead_letters_by_cause(calls):
    down = [dead_letter(f"{RECORD}: RuntimeError: shard {n} down", n) for n in (1, 2)]
    missing = dead_letter(f"{RECORD}: KeyError: 'name'", 3)
    other = dead_letter("ValueError: bad", 4)
    key = json.loads(run("list", "--group", "--json"))[0]["cause"]
    listed = json.loads(run("list", "--json", "--cause", key))
    assert [row["id"] for row in listed] == [row.pk for row in down]
    # A cause is a selection: no --all needed; it narrows the other selections.
    assert "Retried 1 dead letter(s)." in run("retry", "--cause", key, "--shard", "2")
    assert "Retried 1 dead letter(s)." in run("retry", "--cause", key.upper())
    assert not RegionOutbox.objects.filter(pk__in=[row.pk for row in down]).dead().exists()
    missing_key = json.loads(run("list", "--group", "--json", "--id", str(missing.pk)))[0]
    other_key = json.loads(run("list", "--group", "--json", "--id", str(other.pk)))[0]
    out = run("discard", "--cause", missing_key["cause"], "--cause", other_key["cause"])
    assert "Discarded 2 dead letter(s)." in out
    assert not RegionOutbox.objects.dead().exists() and RegionOutbox.objects.count() == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "--cause", "nope"], "is not a cause key"),
        (["retry", "--all", "--group"], "--group goes with list"),
    ],
)
def test_the_cause_options_refuse_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
