"""One daemon thread that runs a drain's background jobs one at a time.

A drain settles a delivered batch (`outbox.engine.behind`) and claims the next one
(`outbox.engine.ahead`) on threads of this kind, each with database connections of its
own, closed when the thread ends. Daemon threads: a job in flight never holds up the
process's exit (its transaction rolls back, and its batch is redelivered).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from django.db import connections

_T = TypeVar("_T")


class JobThread:
    """Runs one job at a time, in the order given, each in its caller's context."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, job: Callable[[], _T]) -> Future[_T]:
        """Run `job` on the thread, in the caller's context (tracing spans, say)."""
        future: Future[_T] = Future()
        context = contextvars.copy_context()
        self._jobs.put((lambda: context.run(job), future))
        return future

    def stop(self) -> None:
        """End the thread once the jobs given are done, and wait for it."""
        self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        try:
            while (item := self._jobs.get()) is not None:
                job, future = item
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            connections.close_all()  # this thread's own connections
