"""A liveness file for a task worker (Celery, Django Tasks): OUTBOX_TASK_LIVENESS_FILE.

`drain_outboxes --liveness-file` touches its file after every round of its one drain. A
task worker instead runs short drain tasks, each within OUTBOX_TASK_SECONDS, and may sit
idle between them. So a thread of the worker process touches the file every few seconds,
busy or idle, as long as no drain of this process has overrun: run past its budget plus
OUTBOX_GRACEFUL_TIMEOUT_SECONDS (the time a stopping drain gives the receiver in flight).
A drain that overran is stuck in a call that does not return; the file then ages, and a
probe that checks its age restarts the worker. It is touched again once the drain ends.

The thread starts when a Celery worker is ready (in its main process, which runs the
tasks of the solo and threads pools; a prefork pool process stuck past
OUTBOX_CELERY_TIME_LIMIT_SECONDS is killed by Celery itself), and with the first outbox
task of a Django Tasks worker process. Nothing runs while the setting is unset.
"""

from __future__ import annotations

import logging
import time

from outbox.conf import outbox_settings
from outbox.engine import DrainWorker
from outbox.health.liveness import LivenessFile
from outbox.periodic import OnePerProcess, Periodic

__all__ = [
    "TOUCH_SECONDS",
    "TaskLiveness",
    "overrun_drains",
    "running_task_liveness",
    "start_task_liveness",
    "stop_task_liveness",
]

logger = logging.getLogger("outbox.engine")

# How often the file is touched; also the slack given to a drain past its budget.
TOUCH_SECONDS = 5.0


def overrun_drains(slack: float = TOUCH_SECONDS) -> list[DrainWorker]:
    """The drains of this process running longer than their budget, the graceful
    timeout and `slack` together (a drain without a budget never overruns)."""
    now = time.monotonic()
    grace = outbox_settings.GRACEFUL_TIMEOUT_SECONDS + slack
    return [
        worker
        for worker in DrainWorker.running()
        if worker.max_seconds
        and worker.started_at is not None
        and now - worker.started_at > worker.max_seconds + grace
    ]


class TaskLiveness(Periodic):
    """Touches `path` every `every` seconds from a daemon thread while no drain of this
    process overran; a failure to touch is logged once, never raised."""

    def __init__(self, path: str, every: float = TOUCH_SECONDS) -> None:
        super().__init__(every, "outbox-liveness")
        self.file = LivenessFile(path)
        self.every = every

    def tick(self) -> None:
        if not overrun_drains(self.every):
            self.file.touch()


_liveness: OnePerProcess[TaskLiveness] = OnePerProcess()


def start_task_liveness() -> TaskLiveness | None:
    """Start this process's liveness thread unless it runs already; None while
    OUTBOX_TASK_LIVENESS_FILE is unset."""
    path = outbox_settings.TASK_LIVENESS_FILE
    if not path:
        return None
    return _liveness.start(lambda: TaskLiveness(path))


def running_task_liveness() -> TaskLiveness | None:
    """This process's liveness thread, if one runs."""
    return _liveness.running()


def stop_task_liveness(timeout: float | None = 5.0) -> None:
    """Stop this process's liveness thread (tests; a worker shutting down)."""
    _liveness.stop(timeout)
