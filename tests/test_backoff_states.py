"""Issue #35 (item 3): a routine retry must not read as a dead worker.

A failed delivery leaves its shard a lease row without a holder (`token` NULL) that
expires when the back-off ends. Once it has ended and no drain has run yet, the shard is
a retry due, waiting for a drain: not stuck. Only a lease a worker took (`token` set)
that ran out is expired (the worker died or stopped renewing), and only that one counts
for `outbox_status --max-expired`, `Thresholds.max_expired` and the dashboard's
"Expired (stuck)". Real drains and claims; the clock moved on with the database's
`Now()`."""

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models.functions import Now
from django.urls import reverse

from outbox.engine import drain_outboxes
from outbox.engine.drain import Drainer
from outbox.health import Thresholds, check, statuses
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.test_operations import lease_states as admin_lease_states

pytestmark = committing

NOTHING_EXPIRED = Thresholds(max_expired=0)


def lease_states(table):
    return {
        key: table[key]
        for key in ("leased_shards", "backing_off_shards", "retry_due_shards", "expired_shards")
    }


def region_status():
    [table] = statuses(models=[RegionOutbox])
    return table


def status_command(*args):
    out = io.StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


def time_passes():
    """Every lease over and every row due, on the database clock."""
    ShardLease.objects.update(expires_at=Now())
    RegionOutbox.objects.pending().update(scheduled_for=Now())


def ended_back_off(calls, shard):
    """A receiver fails on `shard` in a real drain; then its back-off ends."""
    RegionOutboxFactory(shard_identifier=shard)
    calls.failing = {shard}
    assert drain_outboxes([RegionOutbox]).failures == 1
    calls.failing = set()
    assert ShardLease.objects.backing_off().count() == 1
    time_passes()


def dead_workers_lease(shard):
    """A lease taken by a real claim whose worker never came back: it runs out."""
    RegionOutboxFactory(shard_identifier=shard)
    assert Drainer(RegionOutbox, identifiers=[shard]).reserve(1, "gone:1:1").shards
    assert ShardLease.objects.held().count() == 1
    time_passes()


def test_an_ended_back_off_is_a_retry_due_not_an_expired_lease(calls):
    ended_back_off(calls, 5)
    assert check(thresholds=NOTHING_EXPIRED) == []  # no worker died
    text = status_command("--max-expired", "0")  # no breach: no CommandError
    assert lease_states(region_status()) == {
        "leased_shards": 0,
        "backing_off_shards": 0,
        "retry_due_shards": 1,
        "expired_shards": 0,
    }
    assert "1 retry due, 0 expired" in text
    assert "retry due 1, expired 0" in text
    [table] = [
        t for t in json.loads(status_command("--json")) if t["table"] == "outbox.RegionOutbox"
    ]
    assert (table["retry_due_shards"], table["expired_shards"]) == (1, 0)
    [scope] = table["scopes"]
    assert (scope["retry_due_shards"], scope["expired_shards"]) == (1, 0)
    # A drain is all it waits for: it delivers, and the lease goes.
    assert drain_outboxes([RegionOutbox]).receiver_calls == 1
    assert not ShardLease.objects.exists() and not RegionOutbox.objects.exists()


def test_a_dead_workers_lease_is_still_expired_and_breaches(calls):
    dead_workers_lease(6)
    assert lease_states(region_status()) == {
        "leased_shards": 0,
        "backing_off_shards": 0,
        "retry_due_shards": 0,
        "expired_shards": 1,
    }
    [problem] = check(thresholds=NOTHING_EXPIRED)
    assert "1 shard(s) with an expired lease" in problem
    with pytest.raises(CommandError, match="expired lease") as breached:
        status_command("--max-expired", "0")
    assert breached.value.returncode == 6
    assert "retry due" not in str(breached.value)


def test_both_at_once_count_apart_and_only_the_dead_worker_breaches(calls):
    ended_back_off(calls, 5)
    dead_workers_lease(6)
    assert lease_states(region_status())["retry_due_shards"] == 1
    assert lease_states(region_status())["expired_shards"] == 1
    assert check(thresholds=Thresholds(max_expired=1)) == []
    [problem] = check(thresholds=NOTHING_EXPIRED)
    assert "1 shard(s) with an expired lease" in problem


def test_the_admin_tells_the_two_apart(calls, admin_client):
    ended_back_off(calls, 5)
    dead_workers_lease(6)
    assert admin_lease_states(admin_client) == {5: "retry due", 6: "expired"}
    assert admin_lease_states(admin_client, "?state=retry_due") == {5: "retry due"}
    assert admin_lease_states(admin_client, "?state=expired") == {6: "expired"}
    page = admin_client.get(reverse("admin:outbox_dashboard"))
    tables = {table["label"]: table for table in page.context["tables"]}
    region = tables["outbox.RegionOutbox"]
    assert (region["expired"], region["retry_due"], region["backing_off"]) == (1, 1, 0)
    assert "Retry due" in page.content.decode()
