"""OUTBOX_LOOP_GATHER_SECONDS: a loop's round waits after a batch that was not full
before it claims again, so that messages committed one at a time while it works are
claimed, read and settled together; the first message after an idle moment is still
delivered at once, and a stop request ends the wait."""

import threading
import time

from django.db import transaction

from outbox import outbox_context
from outbox.engine import DrainWorker
from outbox.models import RegionOutbox
from outbox.signals import shards_claimed
from tests.conftest import committing
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Delivery
from tests.workers import wait_until

pytestmark = committing

GATHER = 2.0  # long beside the machine's hiccups: a held message is told apart


def write(shard: int) -> float:
    """One message on a shard of its own, in its own transaction, left to the drain;
    when its COMMIT returned (`time.monotonic()`, the clock receivers journal)."""
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            category=Category.ORGANIZATION_UPDATE,
            object_identifier=shard,
            payload={"shard": shard},
        ).save()
    return time.monotonic()


def test_messages_trickling_in_are_claimed_together_and_the_first_at_once(calls, settings):
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.05
    settings.OUTBOX_LOOP_GATHER_SECONDS = GATHER
    calls.journal = True
    claims: list[int] = []

    def claimed(sender, shards, **kwargs):
        if shards:
            claims.append(shards)

    shards_claimed.connect(claimed, sender=RegionOutbox, dispatch_uid="test_loop_gather")
    rounds: list[int] = []
    worker = DrainWorker([RegionOutbox], loop=True, on_round=lambda: rounds.append(1))
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_until(lambda: rounds, timeout=30, message="no first round")
        first_committed = write(1)
        wait_until(lambda: Delivery.objects.exists(), timeout=GATHER, message="the first waited")
        for shard in (2, 3, 4, 5):  # while the round waits after its batch of one
            write(shard)
            time.sleep(0.05)
        wait_until(lambda: not RegionOutbox.objects.exists(), timeout=30)
        stop_asked = time.monotonic()
        worker.request_stop()
        runner.join(30)
        stopped_in = time.monotonic() - stop_asked
    finally:
        shards_claimed.disconnect(dispatch_uid="test_loop_gather")
        worker.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    first = Delivery.objects.get(shard_identifier=1)
    assert first.started - first_committed < GATHER  # not held by the gather
    # The four that trickled in were claimed together: one batch where their commits
    # take a few milliseconds each ([1, 4]); a server slowed by other work (commits of
    # half a second) may split them once, never into a claim each.
    assert claims[0] == 1 and sum(claims[1:]) == 4 and len(claims) <= 3, claims
    assert stopped_in < GATHER  # a stop request ends the wait


def test_a_one_shot_drain_does_not_wait_between_its_batches(calls, settings):
    settings.OUTBOX_LOOP_GATHER_SECONDS = GATHER
    settings.OUTBOX_BATCH_SHARDS = 2  # three batches, none of them full at the end
    for shard in range(5):
        write(shard)
    started = time.monotonic()
    outcome = DrainWorker([RegionOutbox], loop=False).run()
    assert outcome.stats.shards == 5
    assert time.monotonic() - started < GATHER
