"""A hung receiver call holds only its own shard: under `drain_outboxes --loop`, as an
operator runs it (default settings), one call hangs while a writer commits single
messages to other shards, of the same table and of the other one; those are delivered
within a second of their commit all the while (on PostgreSQL's fast path; see BOUND_SECONDS).
And a call that outlasts its round is settled as it returns, not at the loop's next
poll."""

import statistics
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection

from outbox.conf import outbox_settings
from outbox.engine import DrainWorker
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Delivery
from tests.workers import Process, wait_until, worker_env

pytestmark = [committing]

HANG_SECONDS = 30  # the one call's hang: every write below falls inside it
WRITE_SECONDS = 8
PER_SECOND = 100
SHARDS = 200
HUNG_SHARD = 10_000


def commit_one(table: str, shard: int, obj: int, payload: dict) -> None:
    if table in ("region", "region-async"):
        RegionOutbox.objects.create(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            # AUDIT_EVENT: an `async def` receiver's only (OUTBOX_TEST_ASYNC_AUDIT)
            category=Category.AUDIT_EVENT
            if table == "region-async"
            else Category.ORGANIZATION_UPDATE,
            object_identifier=obj,
            payload=payload,
        )
    else:
        ControlOutbox.objects.create(
            region_name="us",
            shard_scope=Scope.USER,
            shard_identifier=shard,
            category=Category.USER_UPDATE,
            object_identifier=obj,
            payload=payload,
        )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * share) - 1)]


# The bound: a second on PostgreSQL's fast path, whose idle loop is woken by each write
# (NOTIFY). MariaDB tells an idle loop nothing: it claims again after each round that
# delivered and otherwise polls every OUTBOX_LOOP_INTERVAL_SECONDS (1 s), so a message
# committed just after a round found nothing waits up to that second, hang or no hang:
# its bound is the interval and half a second more. A portable path's round takes
# several ORM statements, and at PER_SECOND single-message commits on a loaded two-core
# CI machine it fell up to two seconds behind at times (less without the hang, but not
# within a second either). What this test guards against, a round that waits for the
# hung call, keeps every message written meanwhile waiting for the hang itself: far
# beyond every bound.
if not settings.OUTBOX_FAST_PATH:
    BOUND_SECONDS = 3.0
elif connection.vendor == "postgresql":
    BOUND_SECONDS = 1.0
else:
    BOUND_SECONDS = outbox_settings.LOOP_INTERVAL_SECONDS + 0.5


@server_database_only
@pytest.mark.parametrize(
    ("table", "concurrency"),
    [("region", 4), ("region", 16), ("control", 4), ("control", 16), ("region-async", 4)],
)
def test_a_hung_call_holds_only_its_shard_in_the_loop(tmp_path, concurrency, table):
    """`region-async`: every call is an `async def` receiver's, the hung one too.

    A run that misses the bound is measured once more, from a clean table, with a new
    drain and a new hung call: a machine busy with other work can delay one run's
    messages by itself; a round held by the hang delays both."""
    p50, p99 = measure(tmp_path / "drain.log", concurrency, table, HUNG_SHARD)
    if p99 > BOUND_SECONDS:
        print(f"  over the bound; measured again (p99 {p99:.3f}s)")
        clear_tables()
        p50, p99 = measure(tmp_path / "again.log", concurrency, table, HUNG_SHARD + 1)
    assert p99 <= BOUND_SECONDS, (
        f"{table}, concurrency {concurrency}: lag p99 {p99:.2f}s, p50 {p50:.2f}s"
    )


def measure(log, concurrency: int, table: str, hung_shard: int) -> tuple[float, float]:
    """One run: a drain loop, one call hanging on `hung_shard`, the writer meanwhile; the
    other shards' commit-to-receiver lag p50 and p99."""
    env = worker_env(OUTBOX_CONCURRENCY=concurrency)  # the receiver timeout (60 s) is longer
    if table == "region-async":
        env["OUTBOX_TEST_ASYNC_AUDIT"] = "1"
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
    process = Process(args, env, log)
    try:
        hung_table = "region-async" if table == "region-async" else "region"
        commit_one(hung_table, hung_shard, 1, {"hang": HANG_SECONDS})
        wait_until(
            lambda: lease_held(hung_shard), 10, message=f"no call started:\n{process.output()}"
        )
        written = 0
        started = time.monotonic()
        while (now := time.monotonic()) - started < WRITE_SECONDS:
            commit_one(table, written % SHARDS, written, {"written": now})
            written += 1
            time.sleep(max(0.0, started + written / PER_SECOND - time.monotonic()))
        wait_until(
            lambda: Delivery.objects.exclude(shard_identifier=hung_shard).count() >= written,
            timeout=HANG_SECONDS - WRITE_SECONDS - 5,
            message=f"not delivered within the hang:\n{process.output()}",
        )
        assert not Delivery.objects.filter(shard_identifier=hung_shard).exists()  # still hung
    finally:
        process.popen.kill()
        process.popen.wait(10)
    lags = [
        call.started - call.payload["written"]
        for call in Delivery.objects.exclude(shard_identifier=hung_shard)
    ]
    p50, p99 = statistics.median(lags), percentile(lags, 0.99)
    print(
        f"{table}, concurrency {concurrency}: {written} messages, lag p50 {p50:.3f}s p99 {p99:.3f}s"
    )
    assert len(lags) == written
    return p50, p99


def clear_tables() -> None:
    """What a run left: its messages, the hung call's row and lease, the journal."""
    Delivery.objects.all().delete()
    RegionOutbox.objects.all().delete()
    ControlOutbox.objects.all().delete()
    ShardLease.objects.all().delete()


def lease_held(shard: int) -> bool:
    return ShardLease.objects.filter(shard_identifier=shard, holder__gt="").exists()


def test_a_call_that_outlasts_its_round_is_settled_as_it_returns(calls, settings):
    """Nothing else is written, and the loop's poll is 30 s away: the straggler's
    landing ends the loop's wait, and its row is deleted and its shard released then."""
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 30
    settings.OUTBOX_CONCURRENCY = 4
    RegionOutboxFactory(shard_identifier=1, payload={"hang": 1.5})
    worker = DrainWorker([RegionOutbox], loop=True)
    runner = threading.Thread(target=worker.run)
    started = time.monotonic()
    runner.start()
    try:
        wait_until(lambda: not RegionOutbox.objects.exists(), timeout=10)
        settled_after = time.monotonic() - started
    finally:
        worker.request_stop()
        runner.join(30)
    assert len(calls.calls) == 1
    assert 1.5 <= settled_after < 4.0, settled_after
    assert not ShardLease.objects.filter(shard_identifier=1, holder__gt="").exists()
