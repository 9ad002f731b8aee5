"""Background threads that do one thing every few seconds for as long as their process
runs: the task worker's liveness file, the gauges read on a timer.

`Periodic` is one such daemon thread: `tick()` now, then every `interval` seconds until
`stop()`, and `closing()` on the thread as it ends (to close the connections it opened).
`OnePerProcess` keeps at most one of a kind running in a process: the first caller
starts it, later ones get the running one, and a thread that died is replaced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["OnePerProcess", "Periodic"]


class Periodic:
    """A daemon thread calling `tick()` every `interval` seconds until `stop()`."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self: _P) -> _P:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self._stopped.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def tick(self) -> None:
        raise NotImplementedError

    def closing(self) -> None:
        """On the thread, as it ends."""

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                self.tick()
                self._stopped.wait(self.interval)
        finally:
            self.closing()


_P = TypeVar("_P", bound=Periodic)


class OnePerProcess(Generic[_P]):
    """At most one running `Periodic` of a kind in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: _P | None = None

    def start(self, make: Callable[[], _P]) -> _P:
        """The running one, or one made by `make()` and started now."""
        with self._lock:
            if self._current is None or not self._current.is_alive():
                self._current = make().start()
            return self._current

    def running(self) -> _P | None:
        current = self._current
        return current if current is not None and current.is_alive() else None

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the running one, if any (tests; a process that stops draining)."""
        with self._lock:
            current, self._current = self._current, None
        if current is not None:
            current.stop(timeout)
