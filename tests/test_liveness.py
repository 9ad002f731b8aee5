"""`drain_outboxes --liveness-file`: a file a liveness probe can check the age of, kept
fresh by every drain round, busy or idle, and gone once the drain has stopped."""

import contextlib
import threading

import pytest
from django.core.management import CommandError, call_command

from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing


def test_the_file_is_touched_every_round_and_removed_at_the_end(calls, settings, tmp_path):
    settings.OUTBOX_LOOP_INTERVAL_SECONDS = 0.1
    alive = tmp_path / "outbox-alive"
    RegionOutboxFactory(shard_identifier=1, object_identifier=1)
    seen, done = set(), threading.Event()

    def watch():  # the probe's view: the file's modification times while the drain runs
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.add(alive.stat().st_mtime_ns)
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        call_command(
            "drain_outboxes",
            "--loop",
            "--max-seconds",
            "1.5",
            "--progress-every",
            "0",
            "--liveness-file",
            str(alive),
            verbosity=0,
        )
    finally:
        done.set()
        watcher.join(5)
    assert not RegionOutbox.objects.exists()  # it drained as usual
    assert len(seen) >= 4  # touched again and again while idle, not only at the start
    assert not alive.exists()


def test_a_file_that_cannot_be_written_is_refused_at_start(tmp_path):
    missing = tmp_path / "no-such-directory" / "alive"
    with pytest.raises(CommandError, match="Cannot write the liveness file"):
        call_command("drain_outboxes", "--liveness-file", str(missing), verbosity=0)
