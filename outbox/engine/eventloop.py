"""The drain's own event loop, where `async def` receivers are awaited.

A drain delivering on slot threads (`outbox.engine.slots`) starts one event loop on a
thread of its own the first time an async receiver is called, and awaits every async
receiver call of its slots there: many shards' calls wait on the network at once, in
one loop, without a new loop or thread per call. A call past
`OUTBOX_RECEIVER_TIMEOUT_SECONDS` is cancelled and fails with `TimeoutError`.

Outside such a drain (the synchronous flush after commit, a drain with concurrency 1)
an async receiver is run with `asgiref.sync.async_to_sync`, as Django's `Signal.send`
does: the caller needs no running loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import async_to_sync

from outbox.conf import outbox_settings

_current = threading.local()  # .loop: the EventLoop of the drain this thread serves


class EventLoop:
    """An event loop running on a daemon thread until `close()`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="outbox-event-loop", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float | None) -> Any:
        """Await `coroutine` on the loop; cancel it after `timeout` seconds."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"async receiver cancelled after {timeout}s (OUTBOX_RECEIVER_TIMEOUT_SECONDS)"
            ) from None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class LazyEventLoop:
    """One drain's event loop, started at its first async call."""

    def __init__(self) -> None:
        self._loop: EventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> EventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = EventLoop()
            return self._loop

    def serve_this_thread(self) -> None:
        """Async receivers called on this thread are awaited on this drain's loop."""
        _current.loop = self

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()


def async_caller(receiver: Callable[..., Any]) -> Callable[..., Any]:
    """A plain callable that awaits the `async def` receiver: on the drain's event loop
    where the calling thread serves one, else through `async_to_sync`."""
    fallback = async_to_sync(receiver)

    def call(**kwargs: Any) -> Any:
        lazy: LazyEventLoop | None = getattr(_current, "loop", None)
        if lazy is None:
            return fallback(**kwargs)
        timeout = outbox_settings.RECEIVER_TIMEOUT_SECONDS or None
        return lazy.get().run(receiver(**kwargs), timeout)

    return call
