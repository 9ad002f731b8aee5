"""The receiver probe of the sustained section, loaded only by its drain process
(`bench.sustained_settings`).

For every one-message-per-shard message it appends `object_identifier time.time()` to
the file named by OUTBOX_BENCH_SUSTAINED_LOG as the receiver starts; the writers note
the same clock as their commit returns, and the harness joins the two by identifier.
The file is flushed every half second and at exit; `<log>.ready` appears once Django
is set up, so the harness knows the drain is about to poll.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import IO, Any

from django.apps import AppConfig

FLUSH_EVERY_SECONDS = 0.5

_log: IO[str] | None = None
_flushed = 0.0


def note_start(sender: Any, object_identifier: int, **kwargs: Any) -> None:
    global _flushed
    now = time.time()
    if _log is None:
        return
    _log.write(f"{object_identifier} {now:.6f}\n")
    if now - _flushed > FLUSH_EVERY_SECONDS:
        _log.flush()
        _flushed = now


class SustainedProbeConfig(AppConfig):
    name = "bench.sustained_probe"
    label = "bench_sustained_probe"

    def ready(self) -> None:
        global _log
        from bench.outboxes import BenchCategory
        from outbox.signals import process_region_outbox

        path = os.environ.get("OUTBOX_BENCH_SUSTAINED_LOG")
        if not path:
            return
        _log = open(path, "a", encoding="ascii")  # noqa: SIM115 (closed at exit)
        atexit.register(_log.close)
        process_region_outbox.connect(note_start, sender=BenchCategory.AUDIT_EVENT, weak=False)
        Path(path + ".ready").write_text("ready\n", encoding="ascii")
