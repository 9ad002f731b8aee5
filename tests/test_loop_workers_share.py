"""Issue #45 (item 3): loop workers share a backlog. Three `drain_outboxes --loop`
processes, as an operator runs them (default concurrency), are running and idle when a
backlog of single-message shards is committed at once; with receivers that wait 10 ms,
one worker alone would take several seconds over it. Each worker delivers a fair part:
claims are sized to a fraction of a second of calls (`OUTBOX_UNSETTLED_SECONDS`), so no
worker takes the backlog in one batch while the others find nothing to claim.

"Fair" is asserted as at least half of an even share each (a third of the messages
each would be even): a worker's first claim is small and grows with what it delivers,
and the three wake at slightly different moments (NOTIFY on PostgreSQL, the loop's
one-second poll elsewhere)."""

import sys
from collections import Counter

from django.db import transaction

from outbox import outbox_context
from outbox.models import OutboxDrainProcess, RegionOutbox
from tests.conftest import committing, server_database_only
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Delivery
from tests.workers import Process, wait_until, worker_env

pytestmark = [committing]

WORKERS = 3
MESSAGES = 1_200  # one worker alone: 1,200 x 10 ms / 4 slots = 3 s of calls
RECEIVER_SECONDS = 0.01


@server_database_only
def test_loop_workers_share_a_backlog(tmp_path):
    # A beacon (off in the suite) records each loop as it starts: the test waits for all.
    env = worker_env(receiver_delay=RECEIVER_SECONDS, OUTBOX_DRAIN_BEACON_SECONDS=30.0)
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
    processes = [Process(args, env, tmp_path / f"loop{index}.log") for index in range(WORKERS)]
    try:
        # Each loop's beacon records it as it starts: all three are up and idle.
        wait_until(
            lambda: OutboxDrainProcess.objects.alive().filter(kind="loop").count() >= WORKERS,
            timeout=60,
            message="\n".join(process.output() for process in processes),
        )
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutbox.objects.bulk_create(
                RegionOutbox(
                    shard_scope=Scope.ORGANIZATION,
                    shard_identifier=shard,
                    category=Category.ORGANIZATION_UPDATE,
                    object_identifier=shard,
                    payload={"shard": shard},
                )
                for shard in range(MESSAGES)
            )
        wait_until(
            lambda: Delivery.objects.count() >= MESSAGES,
            timeout=60,
            message="\n".join(process.output() for process in processes),
        )
        pids = {process.pid for process in processes}
        delivered = Counter(Delivery.objects.values_list("process", flat=True))
    finally:
        for process in processes:
            process.stop()
    print("messages delivered by each worker:", sorted(delivered.values(), reverse=True))
    assert set(delivered) <= pids and sum(delivered.values()) == MESSAGES, delivered
    fair = MESSAGES / WORKERS / 2
    assert all(delivered[pid] >= fair for pid in pids), (
        f"each worker's part of {MESSAGES} messages, at least {fair:.0f} expected: "
        f"{sorted((delivered[pid] for pid in pids), reverse=True)}"
    )
