"""`manage.py drain_outboxes --loop` as a real process: SIGTERM stops it gracefully."""

import sys
import time

from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing, server_database_only
from tests.factories import RegionOutboxFactory
from tests.testapp.models import Delivery
from tests.workers import Process, wait_until, worker_env

pytestmark = [committing, server_database_only]


def drain_loop(tmp_path, receiver_delay, **settings):
    args = [sys.executable, "-m", "django", "drain_outboxes", "--loop", "--settings=tests.settings"]
    return Process(args, worker_env(receiver_delay, **settings), tmp_path / "drain.log")


def test_sigterm_finishes_the_receiver_in_flight_and_releases_the_rest(tmp_path):
    for shard in range(6):
        for n in range(5):
            RegionOutboxFactory(shard_identifier=shard, object_identifier=shard * 10 + n)
    drainer = drain_loop(tmp_path, receiver_delay=0.3, OUTBOX_BATCH_SHARDS=6)
    try:
        wait_until(lambda: Delivery.objects.exists(), timeout=20)
        exit_seconds = drainer.terminate()
    finally:
        drainer.stop()
    output = drainer.output()
    assert drainer.popen.returncode == 0, output
    assert "stopping after the current receiver" in output
    assert exit_seconds < 3, output
    # Everything it called was delivered and deleted; nothing else was touched.
    delivered = set(Delivery.objects.values_list("object_identifier", flat=True))
    remaining = set(RegionOutbox.objects.values_list("object_identifier", flat=True))
    assert delivered and remaining
    assert not delivered & remaining
    assert len(delivered | remaining) == 30
    assert not ShardLease.objects.exists()  # released at once, not left to expire


def test_sigterm_stops_past_the_graceful_timeout(tmp_path):
    RegionOutboxFactory(shard_identifier=1)
    drainer = drain_loop(tmp_path, receiver_delay=30.0, OUTBOX_GRACEFUL_TIMEOUT_SECONDS=0.5)
    try:
        wait_until(lambda: ShardLease.objects.exists(), timeout=20)
        time.sleep(1.0)  # inside the 30-second receiver
        exit_seconds = drainer.terminate()
    finally:
        drainer.stop()
    assert drainer.popen.returncode == 4, drainer.output()
    assert exit_seconds < 3
    assert "graceful timeout" in drainer.output()
    # The receiver never finished: the row stays, its lease expires by itself.
    assert RegionOutbox.objects.count() == 1
    assert ShardLease.objects.get().token is not None
