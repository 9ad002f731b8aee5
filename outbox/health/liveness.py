"""A liveness file for a supervisor's probe: its modification time says when a drain
process was last seen working.

`drain_outboxes --liveness-file PATH` touches it when the drain starts and after every
drain round, busy or idle (an idle loop rounds at least every
OUTBOX_LOOP_INTERVAL_SECONDS), from the drain's own thread, so a probe that checks its
age notices a drain stuck in a call, not only a dead process; the command removes it
when it ends, so a stopped drainer leaves no fresh file. A task worker's
(`outbox.integrations.task_liveness`) is touched by a thread of its own while no drain
of the process overran.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger("outbox.engine")


class LivenessFile:
    """The file at `path`, touched on each `touch()` and removed by `remove()`."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._failing = False

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
