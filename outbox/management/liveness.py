"""A liveness file for a supervisor's probe: `drain_outboxes --liveness-file PATH`.

The file is touched when the drain starts and after every drain round, busy or idle
(an idle loop rounds at least every OUTBOX_LOOP_INTERVAL_SECONDS), from the drain's own
thread: its modification time says when the drain last got through a round, so a probe
that checks its age notices a drain stuck in a call, not only a dead process. The
waiting thread is left out on purpose: it stays responsive while the drain is stuck.
The file is removed when the command ends, so a stopped drainer leaves no fresh file.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.core.management.base import CommandError

logger = logging.getLogger("outbox.engine")


class LivenessFile:
    """The file at `path`, touched on each `touch()` and removed by `remove()`."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._failing = False
        try:
            self.path.touch()
        except OSError as exc:  # a missing directory, no permission: say so at start
            raise CommandError(f"Cannot write the liveness file {path!r}: {exc}") from exc

    def touch(self) -> None:
        """Mark the drain alive now; a failure is logged once, never raised (the probe
        will then see the file age, which is the point)."""
        try:
            self.path.touch()
        except OSError:
            if not self._failing:
                logger.warning(
                    "outbox could not touch the liveness file %s", self.path, exc_info=True
                )
            self._failing = True
        else:
            self._failing = False

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
